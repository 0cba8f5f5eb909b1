"""Call descriptors: one nonzero int32 per call that every rank computes alike, carried by every signal
and barrier-free header, so a rank that made a different call is caught inside the kernel.

Bits (bit 31 always 0, bit 0 always 1 so the value is odd, never 1 and never specialised by Triton)::

    0        1
    1..7     algorithm code (op and algorithm: ``CODES``)
    8..10    dtype code
    11..12   reduce op (sum, avg, max, min)
    13..15   root rank (broadcast)
    16..30   fingerprint of the size (bytes per rank and shape class; 15 bits)

Two calls that differ in algorithm, dtype, reduce op or root always differ in their descriptor; calls
that differ only in size differ unless their 15-bit fingerprints collide (one pair in 32768).
"""

from __future__ import annotations

import torch

# Algorithm code -> "op.algorithm", filled by symmcoll.plan.register.
CODES: dict[int, str] = {}
_DTYPE_CODES = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3, torch.int32: 4, torch.int64: 5,
                torch.uint8: 6, torch.int16: 7}
_REDUCE_CODES = {"sum": 0, "avg": 1, "max": 2, "min": 3}
FIELDS = ("algorithm", "dtype", "reduce op", "src", "size")


def fingerprint(size_key: int) -> int:
    h = (size_key * 2654435761 + 0x632BE5AB) & 0xFFFFFFFF
    h ^= h >> 15
    h = (h * 0x2C1B3C6D) & 0xFFFFFFFF
    h ^= h >> 12
    return h & 0x7FFF


def encode(code: int, dtype: torch.dtype, reduce_op: str | None, src: int | None, size_key: int) -> int:
    if not 1 <= code < 128:
        raise ValueError(f"algorithm code must be in [1, 128), got {code}")
    return (1 | code << 1 | _DTYPE_CODES.get(dtype, 0) << 8 | _REDUCE_CODES.get(reduce_op or "sum", 0) << 11
            | ((src or 0) & 7) << 13 | fingerprint(size_key) << 16)


def decode(desc: int) -> dict:
    return {"algorithm": desc >> 1 & 0x7F, "dtype": desc >> 8 & 7, "reduce op": desc >> 11 & 3,
            "src": desc >> 13 & 7, "size": desc >> 16 & 0x7FFF}


def algorithm_name(desc: int) -> str:
    code = desc >> 1 & 0x7F
    return CODES.get(code, f"algorithm#{code}")


def differing_fields(mine: int, theirs: int) -> list[str]:
    a, b = decode(mine), decode(theirs)
    out = []
    for name in FIELDS:
        if a[name] != b[name]:
            if name == "algorithm":
                out.append(f"op/algorithm ({algorithm_name(mine)} here, {algorithm_name(theirs)} there)")
            elif name == "size":
                out.append("size (element or row count)")
            else:
                out.append(name)
    return out
