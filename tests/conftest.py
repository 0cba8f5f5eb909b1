"""Shared fixtures: rank pools reused across tests (spawning ranks costs seconds each).

CPU by default (gloo + emulated symmetric memory + interpreter). ``SYMMCOLL_TEST_DEVICE=cuda`` runs the
same tests with CUDA tensors on the GPU machine (scripts/gpu_check.sh; ``cuda-shared``: every rank on
GPU 0, for a one-GPU machine); tests marked ``gpu`` run only there and are reported as skipped -- not
passed -- elsewhere. Test modules may import ``DEVICE`` from here; shared helpers live in rank_checks.py.
"""

from __future__ import annotations

import os

import pytest

from symmcoll.launch import RankPool

DEVICE = os.environ.get("SYMMCOLL_TEST_DEVICE", "cpu")
WORLD_SIZES = [int(w) for w in os.environ.get("SYMMCOLL_TEST_WORLD_SIZES", "2,3,4").split(",")]


def pytest_collection_modifyitems(config, items):
    if DEVICE not in ("cuda", "cuda-shared"):
        skip = pytest.mark.skip(reason="GPU test: NOT RUN on this machine (no CUDA)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


def pytest_runtest_logreport(report):
    """On the GPU machine a run may be cut by its time limit before pytest's summary: print every
    failure as it happens."""
    if DEVICE == "cuda" and report.failed:
        print(f"\nFAILED {report.nodeid} ({report.when})\n{report.longreprtext[-6000:]}\n", flush=True)


class Pools:
    def __init__(self):
        self._pools: dict[int, RankPool] = {}

    def __call__(self, world_size: int) -> RankPool:
        pool = self._pools.get(world_size)
        if pool is None or pool.closed:
            pool = RankPool(world_size, device=DEVICE)
            self._pools[world_size] = pool
        return pool

    def close(self):
        for pool in self._pools.values():
            pool.close()


@pytest.fixture(scope="session")
def pools():
    p = Pools()
    yield p
    p.close()


@pytest.fixture(params=WORLD_SIZES, ids=lambda w: f"ws{w}")
def world_size(request):
    return request.param
