"""World size 8 (the largest the kernels support) on CPU: every collective and all-reduce algorithm
once, small sizes, exact rank-coded checks. The 8-GPU machine runs the same paths for real."""

import pytest
import torch
import torch.distributed as dist

import symmcoll
from symmcoll import reference

from conftest import DEVICE
from rank_checks import assert_close, assert_pads_zero, rank_coded


def _every_collective_at_8(numel):
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 8
    x = rank_coded(numel * world, torch.bfloat16, rank, 1)
    for algorithm in sorted(symmcoll.ALGORITHMS["all_reduce"]):
        assert_close(symmcoll.all_reduce(x, algorithm=algorithm), reference.all_reduce(x),
                     f"all_reduce {algorithm} ws8", exact=True)
    assert_close(symmcoll.reduce_scatter(x), reference.reduce_scatter(x, None), "reduce_scatter ws8",
                 exact=True)
    assert_close(symmcoll.all_gather(x), reference.all_gather(x, None), "all_gather ws8", exact=True)
    assert_close(symmcoll.all_to_all(x), reference.all_to_all(x, None), "all_to_all ws8", exact=True)
    assert_close(symmcoll.broadcast(x, 5), reference.broadcast(x, 5, None), "broadcast ws8", exact=True)
    assert_pads_zero("after ws8 collectives")
    return True


@pytest.mark.skipif(DEVICE == "cuda" and torch.cuda.device_count() < 8, reason="NOT RUN: needs 8 GPUs")
def test_every_collective_at_world_size_8(pools):
    assert pools(8).run(_every_collective_at_8, 37, timeout=600) == [True] * 8
