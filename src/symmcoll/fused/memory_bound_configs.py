"""Launch configs of the memory-bound kernels: all_reduce_rms_norm's local path (world size 1), MoE
dispatch / combine and the quantized all-reduce's codec kernels (bench/roofline.py).

Each answers from the table measured on this GPU model (``data/roofline_<gpu>.json``) when it holds a
case near the request, else from its untuned rule (the caller's). The table is the best candidate of
each case of a benchmarks/roofline.py run (``build_table``; ``python3 benchmarks/roofline.py --out
R.json --write-table T.json`` turns a result file into a table; the ``roofline`` GPU stage writes one
beside its result). A candidate replaces the config that was the default in that run only where it
was faster by more than ``NOISE`` (repeat runs of one config differ by about that much), so a table
never moves a default on noise.

Keys, much as the GEMM's table (fused/gemm_tables.py): the measured hidden size (MoE: and top-k; codecs:
group size) nearest in log distance, within a factor of 2, else no entry; the same quant (format and
direction); MoE: the nearest measured expert count; then the largest measured token count (codecs:
values) <= the request's, else the smallest.
Not the GEMM's smallest >= M: a config measured at more tokens may cut rows in chunks that only pay
when every SM has rows to spare, one measured at fewer never does (the sweep measures every token
count of the issue, so those are exact).

* rms: ``rows`` whole rows per step, or one row in chunks of ``chunk`` values; ``per_thread`` values
  per thread (warps = values of a step / 32 / per_thread, 4 to 32); ``programs`` (the cap);
  ``ahead``: the next step's loads issued before this step's arithmetic (world size 1); ``every_step``:
  one program per step, the programs' cap ignored (world size 1).
* moe: ``block`` elements per step over a token's rows, ``programs``, ``warps``, ``tt`` tokens per item;
  dispatch: ``local_slots``, the most slots (T * k) routed inside the one dispatch launch by variant 1
  (0: never), ``variant`` (fused/moe_rules.py's DISPATCH_VARIANT; absent: 0).
* codec: ``block`` input values per step, ``warps``, ``programs``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from ..plan import LaunchConfig
from .gemm_tables import gpu_key, read_table

# A candidate replaces the default only where it is this much faster (run-to-run spread of one config).
NOISE = 0.03


@dataclass(frozen=True)
class RmsConfig(LaunchConfig):
    """all_reduce_rms_norm's launch: LaunchConfig, and ``ahead``: at world size 1 the next step's first
    chunk is loaded before this step's arithmetic (one row per program at a time hides no latency of
    the next row otherwise)."""

    ahead: bool = False
    # World size 1: one program per step, past max_programs (no slots or epoch table to size): the
    # hardware hands rows to SMs as programs finish. The persistent grid of 1024 programs (8 warps, 46
    # registers at hidden 4096, sm_90 compile) fits 5 programs an SM: 660 run their 8 rows of 8192 while
    # 364 wait, then those 364 run with about half as many warps in flight; one row a program takes 40
    # registers (6 an SM) and no loop, as torch.compile's add + RMSNorm launches it.
    every_step: bool = False


@functools.lru_cache(maxsize=None)
def load_table(key: str | None) -> dict:
    """The shipped table of GPU model ``key`` ({"rms": [...], "moe_dispatch": [...], ...}; empty if none)."""
    return read_table(key, "roofline")


@functools.lru_cache(maxsize=None)
def _device_key(index: int) -> str | None:
    return gpu_key(torch.cuda.get_device_properties(index).name)


def device_table(device: torch.device) -> dict:
    """The table of ``device``'s GPU model (empty off CUDA)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return {}  # (compile checks on a machine with no GPU: the untuned rules)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return load_table(_device_key(index))


def _nearest(entries: list[dict], field: str, value: int) -> list[dict]:
    """The entries at the measured ``field`` nearest to ``value`` (log distance, within a factor of 2)."""
    near = [e[field] for e in entries if max(e[field], value) <= 2 * min(e[field], value)]
    if not near:
        return []
    best = min(near, key=lambda v: (abs(math.log2(v / value)), -v))
    return [e for e in entries if e[field] == best]


def _at_most(entries: list[dict], field: str, value: int) -> dict | None:
    """The entry at the largest measured ``field`` <= ``value``, else at the smallest."""
    if not entries:
        return None
    below = [e for e in entries if e[field] <= value]
    return max(below, key=lambda e: e[field]) if below else min(entries, key=lambda e: e[field])


def rms_entry(table: dict, tokens: int, hidden: int, quant: str | None) -> dict | None:
    entries = [e for e in table.get("rms", ()) if e["quant"] == (quant or "bf16")]
    return _at_most(_nearest(entries, "hidden", hidden), "tokens", tokens)


def rms_config(entry: dict, block_h: int) -> RmsConfig:
    """An rms entry as the launch of rows of BLOCK_H values (a chunk of a row or more is whole rows)."""
    block = entry["rows"] * block_h if "rows" in entry else min(entry["chunk"], block_h)
    warps = max(4, min(32, block // (32 * max(1, entry["per_thread"]))))
    return RmsConfig(block, entry["programs"], warps, bool(entry.get("ahead", False)),
                     bool(entry.get("every_step", False)))


def _closest(entries: list[dict], field: str, value: int) -> list[dict]:
    """The entries at the measured ``field`` nearest to ``value`` (log distance, ties to the larger; no
    window), all of them where the entries do not carry ``field``."""
    measured = {e[field] for e in entries if field in e}
    if not measured:
        return entries
    best = min(measured, key=lambda v: (abs(math.log2(v / max(value, 1))), -v))
    return [e for e in entries if e.get(field) == best]


def moe_entry(table: dict, op: str, tokens: int, hidden: int, k: int, experts: int) -> dict | None:
    """Nearest hidden size and top-k (within a factor of 2), then the nearest measured expert count (the
    one-launch dispatch's routing pass grows with it), then the tokens (``_at_most``)."""
    near = _nearest(_nearest(table.get(op, []), "hidden", hidden), "k", k)
    return _at_most(_closest(near, "experts", experts), "tokens", tokens)


def moe_config(entry: dict) -> tuple[LaunchConfig, int, int, int]:
    """(launch, tokens per item, most slots routed inside the dispatch launch by variant 1, dispatch
    variant: fused/moe_rules.py's DISPATCH_VARIANT) of a moe entry."""
    return (LaunchConfig(entry["block"], entry["programs"], entry["warps"]), entry["tt"], entry.get("local_slots", 0),
            entry.get("variant", 0))


def codec_entry(table: dict, fmt: str, direction: str, group_size: int, numel: int) -> dict | None:
    entries = [e for e in table.get("codec", ()) if e["fmt"] == fmt and e["direction"] == direction]
    return _at_most(_nearest(entries, "group", group_size), "numel", numel)


# ---- building a table from a benchmarks/roofline.py result ------------------------------------------------

# The section, the row name whose configs compete, and the case fields of each table.
_SECTIONS = (("rms", "rms", "symmcoll:one_shot", ("tokens", "hidden", "quant")),
             ("moe_dispatch", "moe_dispatch", "symmcoll:pull", ("tokens", "hidden", "experts", "k")),
             ("moe_combine", "moe_combine", "symmcoll:push", ("tokens", "hidden", "experts", "k")),
             ("codec", "codec", None, ("fmt", "direction", "group", "size")))
# Fields of a row's config in each table.
CONFIG_FIELDS = {"rms": ("rows", "chunk", "per_thread", "programs", "ahead", "every_step"),
                 "moe_dispatch": ("block", "programs", "warps", "tt", "local_slots", "variant"),
                 "moe_combine": ("block", "programs", "warps", "tt"),
                 "codec": ("block", "warps", "programs")}


# Config fields a row may lack (rms: whole rows or a chunk; fields added after earlier result files).
_OPTIONAL_FIELDS = ("rows", "chunk", "ahead", "every_step", "local_slots", "variant")


def _mb(size: str) -> float:
    return float(size.rstrip("M"))


def build_table(result: dict, gpu: str, source: str) -> dict:
    """The table of a roofline result: per case, the fastest checked candidate if it beat the run's
    default by more than NOISE, else the default (rows carry their config's fields: ``config_fields``
    of benchmarks/roofline.py). MoE tables keep the expert counts the sweep ran (every one for dispatch
    since the one-launch variant's routing pass depends on it; 64 for combine)."""
    table = {"gpu": gpu, "source": source, "noise": NOISE,
             "provenance": result.get("meta", {}).get("provenance", {})}
    for key, section, name, fields in _SECTIONS:
        cases: dict[tuple, list] = {}
        for row in result["rows"]:
            if row["section"] == section and "us" in row and (name is None or row["name"] == name) \
                    and all(f in row for f in CONFIG_FIELDS[key] if f not in _OPTIONAL_FIELDS):
                cases.setdefault((row["name"], tuple(row["case"])), []).append(row)
        entries = []
        for (_, case), rows in sorted(cases.items()):
            default = next((r for r in rows if r.get("config") == "default"), None)
            if default is None or len(rows) < 2:
                continue  # no sweep here: nothing measured to pick from
            best = min(rows, key=lambda r: r["us"])
            pick = best if best["us"] < default["us"] * (1 - NOISE) else default
            entry = dict(zip(fields, case))
            if key == "codec":
                entry["numel"] = int(_mb(entry.pop("size")) * (1 << 20)) // 2
            entry.update({f: pick[f] for f in CONFIG_FIELDS[key] if f in pick})
            entry.update(us=round(pick["us"], 2), default_us=round(default["us"], 2), label=pick["config"])
            entries.append(entry)
        table[key] = entries
    return table


# The fields that name a case in each table (codec: numel, as build_table writes it).
CASE_FIELDS = {"rms": ("tokens", "hidden", "quant"), "moe_dispatch": ("tokens", "hidden", "experts", "k"),
               "moe_combine": ("tokens", "hidden", "experts", "k"), "codec": ("fmt", "direction", "group", "numel")}


def merge_tables(new: dict, base: dict) -> dict:
    """``new`` (a run's table) with ``base``'s entries for the cases the run did not measure (a run of some
    parts, or one a deadline cut): per table the run's entries, then base's whose case no run entry
    names, each kept entry marked with the run it came from (``source``)."""
    merged = dict(new)
    for key, fields in CASE_FIELDS.items():
        measured = {tuple(e.get(f) for f in fields) for e in new.get(key, [])}
        kept = [dict(e, source=e.get("source", base.get("source"))) for e in base.get(key, [])
                if tuple(e.get(f) for f in fields) not in measured]
        merged[key] = list(new.get(key, [])) + kept
    return merged
