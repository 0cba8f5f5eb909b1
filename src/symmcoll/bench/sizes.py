"""Byte sizes as people type them ("4K", "256M", "1G") and the geometric sweep nccl-tests uses (-b -e -f)."""

from __future__ import annotations

import re

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)([KMG]?)(?:I?B)?")


def parse_size(text: str) -> int:
    """'4K' -> 4096, '256M', '1G', '512', '1.5K', '4KB', '4KiB'; binary units, as nccl-tests."""
    match = _SIZE.fullmatch(text.strip().upper())
    if match is None:
        raise ValueError(f"not a size: {text!r} (examples: 4096, 4K, 256M, 1G)")
    value = float(match.group(1)) * _UNITS[match.group(2)]
    if value != int(value) or value < 1:
        raise ValueError(f"size must be a positive whole number of bytes, got {text!r}")
    return int(value)


def format_size(nbytes: int) -> str:
    """The largest unit that divides exactly: 4096 -> '4K', 3 << 20 -> '3M', 1000 -> '1000'."""
    for unit in ("G", "M", "K"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return str(nbytes)


def size_sweep(begin: int, end: int, factor: float) -> list[int]:
    """begin, begin*factor, ... up to and including end (nccl-tests' -b/-e/-f)."""
    if begin < 1 or end < begin:
        raise ValueError(f"need 1 <= begin <= end, got begin={begin} end={end}")
    if factor <= 1 and begin != end:
        raise ValueError(f"step factor must be > 1, got {factor}")
    sizes = [begin]
    while sizes[-1] < end:
        nxt = int(sizes[-1] * factor)
        if nxt > end:
            break
        sizes.append(nxt)
    return sizes
