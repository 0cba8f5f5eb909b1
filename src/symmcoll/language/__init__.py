"""@triton.jit building blocks: peer pointers, signals, barriers (see signals.py)."""

from .signals import (
    EPOCH_SLOTS,
    MAX_WORLD,
    block_barrier,
    end_launch,
    launch_epoch,
    peer_ptr,
    send_signals,
    wait_filled,
    wait_filled_rows,
    wait_flagged,
    wait_signals,
)

__all__ = ["EPOCH_SLOTS", "MAX_WORLD", "block_barrier", "end_launch", "launch_epoch", "peer_ptr",
           "send_signals", "wait_filled", "wait_filled_rows", "wait_flagged", "wait_signals"]
