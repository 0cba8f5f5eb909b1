"""Where a result came from: git sha, versions, GPU, backend (collected inside a rank, which sees the
GPU and the process group as the measurements do)."""

from __future__ import annotations

import datetime
import hashlib
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


# What decides a run's code: the package's sources and packaged tables (paths relative to the repository root).
DIGESTED = ("src/symmcoll",)
DIGEST_SUFFIXES = (".py", ".json")


def _digest(files) -> str:
    """sha256 over (path, bytes) pairs in path order, 16 hex digits."""
    h = hashlib.sha256()
    for path, data in sorted(files):
        h.update(path.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:16]


def tree_digest(root: str | Path) -> str:
    """Digest of the sources under ``root`` (a checkout or the device machine's copy of one, which has no
    .git): every DIGEST_SUFFIXES file under DIGESTED. gpu_check.sh writes it to env.txt, so a result names
    the code that ran even where the carried sha file was stale."""
    root = Path(root)
    return _digest((p.relative_to(root).as_posix(), p.read_bytes()) for d in DIGESTED for p in (root / d).rglob("*")
                   if p.is_file() and p.suffix in DIGEST_SUFFIXES and "__pycache__" not in p.parts)


def commit_digest(repo: str | Path, commit: str) -> str:
    """tree_digest of ``commit`` in the git repository ``repo``, read from git's objects (no checkout):
    compare it with a result's env.txt to know which commit ran."""
    run = lambda *args: subprocess.run(["git", *args], cwd=repo, capture_output=True, check=True).stdout  # noqa: E731
    paths = run("ls-tree", "-r", "--name-only", commit, "--", *DIGESTED).decode().split("\n")
    return _digest((p, run("show", f"{commit}:{p}")) for p in paths
                   if p.endswith(DIGEST_SUFFIXES) and "__pycache__" not in p.split("/"))


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


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description="The source digest gpu_check.sh writes to env.txt: of a tree, "
                                                 "or of commits of this repository (which commit ran).")
    parser.add_argument("--tree", default=None, help="a checkout or copy (default: none)")
    parser.add_argument("commits", nargs="*", help="commits to digest from git's objects")
    args = parser.parse_args()
    if args.tree:
        print("tree", tree_digest(args.tree))
    for commit in args.commits:
        print(commit, commit_digest(".", commit))
