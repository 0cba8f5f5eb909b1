"""Where a result came from: git sha, versions, GPU, backend (collected inside a rank, which sees the
GPU and the process group as the measurements do)."""

from __future__ import annotations

import datetime
import os
import platform
import socket
import subprocess
from pathlib import Path

import torch
import torch.distributed as dist
import triton

import symmcoll

from .results import Provenance


def git_sha() -> str:
    """HEAD of the checkout symmcoll is imported from ("-dirty" if it has local changes);
    $SYMMCOLL_GIT_SHA wins (for copies of the tree without .git, as on the GPU machine)."""
    if os.environ.get("SYMMCOLL_GIT_SHA"):
        return os.environ["SYMMCOLL_GIT_SHA"]
    source = Path(symmcoll.__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=source,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}-dirty" if dirty else (sha or "unknown")


def nccl_version() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - CPU builds have no NCCL
        return None
    return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)


def collect(device_type: str) -> Provenance:
    """Provenance of a run whose ranks compute on ``device_type`` ("cuda" | "cpu")."""
    on_gpu = device_type == "cuda"
    return Provenance(
        git_sha=git_sha(),
        symmcoll_version=symmcoll.__version__,
        torch_version=torch.__version__,
        triton_version=triton.__version__,
        nccl_version=nccl_version() if on_gpu else None,
        python_version=platform.python_version(),
        hostname=socket.gethostname(),
        device_type="cuda" if on_gpu else "cpu",
        gpu_name=torch.cuda.get_device_name() if on_gpu else None,
        gpu_count=torch.cuda.device_count() if on_gpu else 0,
        backend=str(dist.get_backend()).lower() if dist.is_initialized() else "none",
        created_utc=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
