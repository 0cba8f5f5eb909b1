"""Launcher (timeouts, errors), emulated workspace life cycle, and bounded device-side waits."""

import os
import time
from unittest import mock

import pytest
import torch
import torch.distributed as dist

import symmcoll
from symmcoll import launch
from symmcoll.memory import SymmcollTimeoutError
from symmcoll.memory.emulated import leftover_files, shm_prefix

import rank_checks
from conftest import DEVICE


def _rank_info():
    ws = symmcoll.get_workspace()
    return dist.get_rank(), dist.get_world_size(), ws.world_size, ws.buffer_bytes, ws.signal_pad.numel()


def test_pool_runs_on_every_rank(pools):
    info = pools(3).run(_rank_info)
    assert [i[0] for i in info] == [0, 1, 2]
    assert all(i[1] == i[2] == 3 for i in info)


def _sleep_on(rank_to_hang):
    if dist.get_rank() == rank_to_hang:
        time.sleep(3600)
    return dist.get_rank()


def test_hard_timeout_names_unfinished_ranks():
    t0 = time.monotonic()
    with pytest.raises(launch.LaunchTimeout, match=r"ranks \[1\] had not finished"):
        launch.run(_sleep_on, 2, 1, device=DEVICE, timeout=1)
    assert time.monotonic() - t0 < 60


def _fail_on(rank_to_fail):
    if dist.get_rank() == rank_to_fail:
        raise KeyError("deliberate failure")
    return dist.get_rank()


def test_exception_surfaces_with_rank_and_traceback():
    with pytest.raises(launch.RankError) as info:
        launch.run(_fail_on, 3, 2, device=DEVICE, timeout=120)
    assert list(info.value.failures) == [2]
    assert "rank 2 failed" in str(info.value)
    assert "KeyError: 'deliberate failure'" in str(info.value)
    assert "_fail_on" in str(info.value)  # the traceback, not just the message


def _mapped_then_report():
    symmcoll.get_workspace()
    dist.barrier()
    return shm_prefix()


def _crash_after_mapping():
    symmcoll.get_workspace()
    dist.barrier()
    if dist.get_rank() == 1:
        os._exit(3)
    return shm_prefix()


@pytest.mark.skipif(DEVICE != "cpu", reason="emulated memory is the CPU path")
def test_shm_files_gone_after_mapping_and_after_crash():
    prefixes = launch.run(_mapped_then_report, 2, device="cpu")
    assert len(set(prefixes)) == 1
    # Unlinked as soon as all ranks mapped them, i.e. while the ranks are still running.
    with launch.RankPool(2, device="cpu") as pool:
        prefix = pool.run(_mapped_then_report)[0]
        assert leftover_files(prefix) == []
    with pytest.raises(launch.RankError, match="rank 1 process exited with code 3"):
        launch.run(_crash_after_mapping, 2, device="cpu", timeout=120)
    assert leftover_files("symmcoll-") == [] or all(
        not p.startswith(f"/dev/shm/symmcoll-{os.getpid()}-") for p in leftover_files("symmcoll-"))


def _absent_peer(absent_rank, algorithm, patient_rank=None):
    """On a pool's ranks: fresh workspaces before (the first call creates them together) and after
    (the failed call leaves them unusable), the timeout as it was."""
    # patient_rank waits 4x longer than the others: anything its peers still send after giving up
    # reaches it before its own timeout.
    timeout = "4" if dist.get_rank() == patient_rank else "1"
    with mock.patch.dict(os.environ, SYMMCOLL_TIMEOUT_S=timeout):
        symmcoll.reset()
        try:
            return _absent_peer_call(absent_rank, algorithm)
        finally:
            symmcoll.reset()


def _absent_peer_call(absent_rank, algorithm):
    x = torch.ones(100, device=rank_checks.device())
    # A first call together: workspaces and algorithm state are created collectively.
    symmcoll.all_reduce(x, algorithm=algorithm)
    if dist.get_rank() == absent_rank:
        return None
    t0 = time.monotonic()
    try:
        symmcoll.all_reduce(x, algorithm=algorithm)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        symmcoll.check()
    except SymmcollTimeoutError as exc:
        return exc.op, exc.rank, exc.peer, time.monotonic() - t0, str(exc)
    return "no error"


# Algorithms where a rank may wait on the missing rank only through a neighbour (tree: a leaf waits on
# its parent, which waits on the missing child); such a rank names the neighbour, which raised too.
RELAYED_WAITS = {"tree"}


def _check_absent_peer_errors(results, absent, algorithm):
    assert results[absent] is None
    present = [r for r in range(len(results)) if r != absent]
    for rank in present:
        assert results[rank] != "no error", f"rank {rank} did not notice the absent peer"
        op, r, peer, seconds, message = results[rank]
        assert (op, r) == (f"all_reduce.{algorithm}", rank)
        if algorithm in RELAYED_WAITS:
            assert peer == absent or peer in present and peer != rank, (rank, peer)
        else:
            assert peer == absent, (rank, peer)
        assert f"rank {peer}" in message and f"all_reduce.{algorithm}" in message
        assert seconds < 150
    assert any(results[r][2] == absent for r in present), "no rank named the absent one"


@pytest.mark.parametrize("algorithm", sorted(symmcoll.ALGORITHMS["all_reduce"]))
def test_absent_peer_makes_others_raise_not_hang(pools, algorithm):
    results = pools(3).run(_absent_peer, 2, algorithm, timeout=300)
    _check_absent_peer_errors(results, 2, algorithm)


def test_tree_absent_leaf_four_ranks_every_rank_raises(pools):
    # Rank 3 is a leaf under rank 1 in tree 0 and the root of tree 1: rank 0 waits on it only through
    # ranks 1 and 2, and must still raise rather than return a sum without rank 3, even when (patient)
    # it would outwait its neighbours' timeouts.
    results = pools(4).run(_absent_peer, 3, "tree", 0, timeout=300)
    _check_absent_peer_errors(results, 3, "tree")


def _interpreted_types() -> list[str]:
    """What differs between the cached numpy dtypes of the interpreter and its own answer, and whether a
    tuple type's name reads as triton formats it (language/interpreter_types.py); [] when all agree."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    cached = interpreter._get_np_dtype
    wrong = [] if hasattr(cached, "original") else ["the interpreter's _get_np_dtype is not the cached one"]
    scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64, tl.uint64, tl.float16,
               tl.bfloat16, tl.float32, tl.float64, tl.float8e5, tl.float8e4nv]
    kinds = scalars + [tl.block_type(t, [4, 2]) for t in scalars] + [tl.pointer_type(tl.float32),
                                                                       tl.block_type(tl.pointer_type(tl.bfloat16), [8])]
    for _ in range(2):  # (the second round answers from the cache)
        for kind in kinds:
            got, want = cached(kind), getattr(cached, "original", cached)(kind)
            if got != want or not isinstance(got, np.dtype):
                wrong.append(f"{kind}: {got} != {want}")
    block = tl.block_type(tl.float32, [4])
    name = str(tl.tuple_type([tl.int32, block], ["a", "b"]))
    if name != f"[a:int32,b:{block}]" or str(tl.tuple_type([tl.int8])) != "[:int8]":
        wrong.append(f"tuple_type name {name!r}")
    return wrong


def test_interpreted_types_cached_as_the_interpreter_answers(pools):
    assert pools(2).run(_interpreted_types) == [[], []]
