"""Call descriptors: one nonzero int32 per call that every rank computes alike, carried by every signal
and barrier-free header, so a rank that made a different call is caught inside the kernel.

Bits (bit 31 always 0, bit 0 always 1 so the value is odd, never 1 and never specialised by Triton)::

    0        1
    1..7     algorithm code (op and algorithm: ``CODES``)
    8..13    dtype code of the main input (every torch dtype its own: ``DTYPE_CODES``)
    14..16   the op's argument: the reduce op of a reduction, the root rank of a broadcast
    17..30   fingerprint of every other field the ranks must agree on (shapes of the inputs, splits,
             options such as group_size or max_rows; 14 bits)

Two calls that differ in op, algorithm, dtype, reduce op or root always differ in their descriptor, and
so do two calls whose inputs differ in one dimension by less than 16384; calls that differ otherwise
only in the fingerprinted fields differ unless their fingerprints collide (one pair in 16384).

A descriptor names its fields too: every rank remembers the fields of each descriptor it uses and
posts them to the process group's store once, when the plan is made (``remember``). A rank that finds
a peer's descriptor different from its own reads the peer's fields back (``difference``) and names
exactly the fields that differ, with both values; without the store (or the peer's post) it names the
fields the descriptors' bits can tell apart.
"""

from __future__ import annotations

import hashlib
import json

import torch

# Algorithm code -> "op.algorithm", filled by symmcoll.registry.register.
CODES: dict[int, str] = {}
# Every dtype torch has, in a fixed order (codes must not change between releases: append only).
_DTYPE_ORDER = ("bfloat16", "float16", "float32", "int32", "int64", "uint8", "int16", "int8", "bool", "float64",
                "complex32", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "uint16", "uint32", "uint64", "qint8",
                "quint8", "qint32", "quint4x2", "quint2x4", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2",
                "int1", "int2", "int3", "int4", "int5", "int6", "int7", "uint1", "uint2", "uint3", "uint4", "uint5",
                "uint6", "uint7")
DTYPE_CODES = {getattr(torch, name): code for code, name in enumerate(_DTYPE_ORDER, 1) if hasattr(torch, name)}
OTHER_DTYPE = 63  # a dtype newer than this table: its name goes into the fingerprint
_REDUCE_CODES = {"sum": 0, "avg": 1, "max": 2, "min": 3}
# Fields with bits of their own; every other field is in the fingerprint.
HEADER_FIELDS = ("op", "algorithm", "dtype", "reduce_op", "src")


def _hash(value) -> int:
    return int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=4).digest(), "little")


def _fingerprint(fields: dict, dtype: torch.dtype) -> int:
    """14 bits of the fields without bits of their own. Shapes enter linearly, each dimension (and the
    rank) times an odd factor of its own: two calls whose shapes differ in one dimension by less than
    16384 (the usual mistake: one rank's size off by a few) always differ; other differences collide
    one time in 16384."""
    rest, shapes = [], 0
    for name, value in sorted(fields.items()):
        if name in HEADER_FIELDS:
            continue
        if isinstance(value, tuple) and all(isinstance(d, int) for d in value):
            factors = _hash(name)
            for i, d in enumerate((len(value), *value)):
                shapes += d * ((factors >> (3 * i) & 0x3FFF) | 1)
        else:
            rest.append((name, repr(value)))
    if dtype not in DTYPE_CODES:
        rest.append(("dtype", str(dtype)))
    return (_hash(rest) + shapes) & 0x3FFF


def encode(code: int, dtype: torch.dtype, fields: dict) -> int:
    """The descriptor of a call of algorithm ``code`` on a main input of ``dtype`` whose agreed fields
    are ``fields`` (``reduce_op`` / ``src`` among them where the op has one)."""
    if not 1 <= code < 128:
        raise ValueError(f"algorithm code must be in [1, 128), got {code}")
    argument = _REDUCE_CODES[fields["reduce_op"]] if "reduce_op" in fields else int(fields.get("src") or 0) & 7
    return (1 | code << 1 | DTYPE_CODES.get(dtype, OTHER_DTYPE) << 8 | argument << 14
            | _fingerprint(fields, dtype) << 17)


def decode(desc: int) -> dict:
    return {"algorithm": desc >> 1 & 0x7F, "dtype": desc >> 8 & 0x3F, "argument": desc >> 14 & 7,
            "fingerprint": desc >> 17 & 0x3FFF}


def algorithm_name(desc: int) -> str:
    code = desc >> 1 & 0x7F
    return CODES.get(code, f"algorithm#{code}")


# ---- the fields behind each descriptor ----------------------------------------------------------------

_FIELDS: dict[int, dict] = {}  # desc -> fields of this process's calls
_POSTED: set[int] = set()


def _key(global_rank: int, desc: int) -> str:
    return f"symmcoll/call/{global_rank}/{desc}"


def _store():
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    if not dist.is_initialized():
        return None
    try:
        return c10d._get_default_store()
    except Exception:  # noqa: BLE001 - no store: errors name what the descriptors tell
        return None


def remember(desc: int, fields: dict) -> None:
    """Record what ``desc`` stands for, and post it for the peers (once per descriptor and process)."""
    _FIELDS[desc] = fields
    if desc in _POSTED:
        return
    import torch.distributed as dist
    store = _store()
    if store is not None:
        store.set(_key(dist.get_rank(), desc), json.dumps({k: repr(v) for k, v in fields.items()}))
        _POSTED.add(desc)


def fields_of(desc: int) -> dict | None:
    return _FIELDS.get(desc)


def _peer_fields(desc: int, peer_global_rank: int) -> dict | None:
    store = _store()
    if store is None:
        return None
    key = _key(peer_global_rank, desc)
    try:
        if not store.check([key]):
            return None
        return json.loads(store.get(key))
    except Exception:  # noqa: BLE001 - the store is gone (peer died): fall back to the bits
        return None


def _bit_difference(mine: int, theirs: int) -> list[str]:
    a, b = decode(mine), decode(theirs)
    out = []
    if a["algorithm"] != b["algorithm"]:
        ours, their = algorithm_name(mine).split(".")[0], algorithm_name(theirs).split(".")[0]
        out.append("op" if ours != their else "algorithm")
    if a["dtype"] != b["dtype"]:
        out.append("dtype")
    mine_fields = _FIELDS.get(mine, {})
    if a["argument"] != b["argument"]:
        out.append("src" if "src" in mine_fields else "reduce_op")
    if a["fingerprint"] != b["fingerprint"]:
        out += [k for k in mine_fields if k not in HEADER_FIELDS] or ["shape"]
    return out


def difference(mine: int, theirs: int, peer_global_rank: int | None) -> tuple[list[str], str]:
    """(names of the fields in which the call ``theirs`` of rank ``peer_global_rank`` differs from this
    rank's call ``mine``, a phrase with both values)."""
    ours = _FIELDS.get(mine)
    their = None if peer_global_rank is None else _peer_fields(theirs, peer_global_rank)
    if ours is None or their is None:
        names = _bit_difference(mine, theirs)
        return names, f"{algorithm_name(mine)} here, {algorithm_name(theirs)} there"
    ours = {k: repr(v) for k, v in ours.items()}
    names = [k for k in dict.fromkeys([*ours, *their]) if ours.get(k) != their.get(k)]
    if not names:  # the same fields under two descriptors: this process's table is older than the peer's
        names = _bit_difference(mine, theirs)
    values = "; ".join(f"{k} {_show(ours.get(k))} here, {_show(their.get(k))} there" for k in names)
    return names, values


def _show(value: str | None) -> str:
    return "(none)" if value is None else value.strip("'")
