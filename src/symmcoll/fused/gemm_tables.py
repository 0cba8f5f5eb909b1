"""Which tile config the GEMM core runs for a problem: ``gemm_config(M, N, K, dtype, device, split=True)``
answers from the table measured on this GPU model (``data/gemm_<gpu>.json``, written by ``symmcoll tune
--op gemm``: ``write_table``) when it holds the (N, K) shape (``lookup``), else from
``gemm_configs.untuned_config``, the rule. Fused ops ask with ``split=False`` (their tiles are whole).

Its own module because it is the part that reads files and asks the GPU (``device_facts``); the config
type, the rule and the split plans it answers with are gemm_configs.py's, the candidates the tables
are measured from gemm_candidates.py's (see gemm_configs.py's docstring for the three parts). The
table files of the other kernels (``table_path``, ``read_table``: roofline, dispatch) sit beside these.
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import replace
from pathlib import Path

import torch

from .gemm_configs import CPU_CONFIG, SMEM_BUDGET, GemmConfig, untuned_config

DATA = Path(__file__).resolve().parent.parent / "data"


def gpu_key(name: str) -> str | None:
    """The table a GPU reads: 'h200' or 'h100' (other GPUs: the rule only)."""
    lowered = name.lower()
    for key in ("h200", "h100"):
        if key in lowered:
            return key
    return None


def table_path(key: str, kind: str = "gemm") -> Path:
    """Where the ``kind`` table of GPU model ``key`` ships: "gemm" (this module's tile configs),
    "roofline" (the memory-bound kernels', fused/memory_bound_configs.py) or "dispatch" (algorithm="auto"
    of the collectives, dispatch.py)."""
    return DATA / f"{kind}_{key}.json"


def read_table(key: str | None, kind: str = "gemm") -> dict:
    """The JSON of the ``kind`` table of GPU model ``key`` (empty where none ships)."""
    if key is None or not table_path(key, kind).exists():
        return {}
    return json.loads(table_path(key, kind).read_text())


@functools.lru_cache(maxsize=None)
def load_table(key: str | None) -> dict:
    """{(m, n, k): (best config, best config without split)} of a shipped table (empty if none)."""
    data = read_table(key)
    return table_of(data["entries"]) if data else {}


@functools.lru_cache(maxsize=None)
def measured_cells(key: str | None) -> dict:
    """{(m, n, k): (the Triton core's time / cuBLAS's, cuBLAS us) as the tune measured them} of a shipped table
    (empty if none; the time is None in a table written before it was kept): a cell whose best config is the Gluon
    decode kernel (GemmConfig.gluon, the plain matmul's alone) gives the core's own best ("core_ratio"), or nothing
    where the row has none -- the Gluon kernel's time is no measurement of a kernel a fused op runs."""
    data = read_table(key)
    found = {}
    for e in data.get("entries", ()):
        ratio = e.get("core_ratio") if GemmConfig.from_list(e["config"]).gluon else e.get("ratio")
        if ratio:
            found[(e["m"], e["n"], e["k"])] = (ratio, e.get("cublas_us"))
    return found


def measured_cell(m: int, n: int, k: int, device: torch.device) -> tuple[float, float | None] | None:
    """(the core's time over cuBLAS's, cuBLAS's time in us) that the table of ``device``'s GPU measured at
    exactly (m, n, k) (None: not measured there, or not a GPU). What a one-rank fused op reads to run the
    core or cuBLAS."""
    if device.type == "cpu":
        return None
    return measured_cells(device_facts(device)[0]).get((m, n, k))


def table_of(rows: list[dict]) -> dict:
    """``lookup``'s table of a table file's rows."""
    return {(e["m"], e["n"], e["k"]): (GemmConfig.from_list(e["config"]), GemmConfig.from_list(e["no_split"]))
            for e in rows}


@functools.lru_cache(maxsize=None)
def _device_facts(index: int) -> tuple[str | None, int]:
    props = torch.cuda.get_device_properties(index)
    return gpu_key(props.name), props.multi_processor_count


def device_facts(device: torch.device) -> tuple[str | None, int]:
    """(table key, SM count) of the GPU ``device`` names; an H200's (``"h200"``, 132) where there is
    no GPU to ask (meta tensors of the compile checks, a CPU-side choice of what a GPU would run)."""
    if device.type == "cuda" and torch.cuda.is_available():
        return _device_facts(device.index if device.index is not None else torch.cuda.current_device())
    return "h200", 132


def lookup(table: dict, m: int, n: int, k: int, split: bool) -> GemmConfig | None:
    """The table's config for M's bucket -- the smallest M the table measured (at any shape) >= m, or
    its largest -- at the measured (N, K) nearest to (n, k) (log distance; each within a factor of 2)
    that holds that M; None if none does. A shape measured at a few M only (a tune cut short, or
    one run on the cells a bench found slow) answers for those M, never for the others: a config
    measured at M = 128 is no answer at M = 16."""
    def distance(shape):
        return abs(math.log2(shape[0] / n)) + abs(math.log2(shape[1] / k)), shape
    measured_ms = sorted({tm for tm, _, _ in table})
    bucket = next((tm for tm in measured_ms if tm >= m), measured_ms[-1] if measured_ms else None)
    near = [(tn, tk) for tm, tn, tk in table if tm == bucket and max(n, tn) <= 2 * min(n, tn)
            and max(k, tk) <= 2 * min(k, tk)]
    if not near:
        return None
    best, no_split = table[(bucket, *min(near, key=distance))]
    # split=False asks for a fused op's tile, which has one column part (the tune never writes another)
    return best if split else no_split if not no_split.block_n2 else replace(no_split, block_n2=0)


def gemm_config(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device, split: bool = True) -> GemmConfig:
    """The tile config for C[m, n] = A[m, k] @ B[k, n] on ``device`` (every rank of a fused op passes
    the same shape and gets the same config)."""
    if device.type == "cpu":
        return CPU_CONFIG
    key, sms = device_facts(device)
    table = load_table(key)
    # Every eager call of a fused op asks again; the table lookup scans every measured (N, K) (most of
    # the op's host time before this cache). An answer holds while its table is the one loaded.
    picked_key = (m, n, k, dtype, key, sms, split)
    picked = _PICKED.get(picked_key)
    if picked is not None and picked[0] is table:
        return picked[1]
    config = lookup(table, m, n, k, split) if dtype in (torch.bfloat16, torch.float16) else None
    config = (config or untuned_config(m, n, k, sms, split)).for_itemsize(dtype.itemsize)
    if not split:  # a fused op's own kernel: its epilogue's buffers beside the pipeline (SMEM_BUDGET's room)
        config = config.fitted(dtype.itemsize, SMEM_BUDGET)
    if len(_PICKED) >= _MAX_PICKED:
        _PICKED.clear()
    _PICKED[picked_key] = (table, config)
    return config


# gemm_config's answers: (m, n, k, dtype, table key, SMs, split) -> (the table they came from, config).
_PICKED: dict[tuple, tuple[dict, GemmConfig]] = {}
_MAX_PICKED = 4096


def explicit_entry(row: dict) -> dict:
    """A table row with its configs written out in full (``as_list``): a row kept from an older table
    says in so many fields what it was measured as (``from_list``), and its label follows."""
    config, no_split = GemmConfig.from_list(row["config"]), GemmConfig.from_list(row["no_split"])
    return {**row, "config": config.as_list(), "no_split": no_split.as_list(), "label": config.label}


def write_table(key: str, provenance: dict, rows: list[dict], path: Path | None = None,
                settings: dict | None = None) -> Path:
    """Write a tuned table: rows of {m, n, k, config, no_split, us, ...} (symmcoll tune --op gemm), and the
    table's measured ``settings`` (e.g. TABLE_SETTINGS' "pdl_decode"), which a re-tune carries over."""
    path = path or table_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [explicit_entry(row) for row in rows]
    path.write_text(json.dumps({"gpu": provenance.get("gpu"), "provenance": provenance, **(settings or {}),
                                "entries": rows}, indent=1) + "\n")
    load_table.cache_clear()
    measured_cells.cache_clear()
    pdl_decode_limits.cache_clear()
    pdl_small_limits.cache_clear()
    return path


# A table's fields besides its rows that a re-tune keeps: "pdl_decode" -- {"max_m", "max_b_bytes", "measured"}:
# the plain GEMM's whole-tile decode launches up to that M and that many bytes of B run with programmatic
# dependent launch and early release on this GPU model (fused/gemm.py launch_meta); "pdl_small" -- {"max_macs",
# "max_b_bytes", "measured"}: the GEMM core's whole-tile launches of at most that many multiply-adds and bytes
# of B (small products, L2-warm: 1024^3) run with programmatic dependent launch on this GPU model, the plain
# matmul's and the fused ops' alike (fused/gemm.py small_pdl); absent: they do not (not measured there).
TABLE_SETTINGS = ("pdl_decode", "pdl_small")


def table_settings(data: dict) -> dict:
    """The TABLE_SETTINGS fields of a table file's JSON."""
    return {name: data[name] for name in TABLE_SETTINGS if name in data}


# SYMMCOLL_PDL_DECODE_LIMITS="<max M>,<max bytes of B>" stands for every table's "pdl_decode" (measuring the rule
# on a GPU model whose table has none, e.g. the H100: scripts/gpu_check.sh's pdl stage passes PDL_DECODE_LIMITS).
_LIMITS_OVERRIDE = os.environ.get("SYMMCOLL_PDL_DECODE_LIMITS", "")


def _setting_limits(key: str | None, setting: str, fields: tuple[str, str], override: str, variable: str,
                    form: str) -> tuple[int, int] | None:
    """The two limits of table setting ``setting`` (its ``fields``) of GPU model ``key``, or of ``override`` (the
    environment variable ``variable``'s value, written ``form``) where it is set; None where neither is."""
    if override:
        try:
            first, second = (int(part) for part in override.split(","))
        except ValueError:
            raise ValueError(f"{variable} must be '{form}', got {override!r}") from None
        return first, second
    found = read_table(key).get(setting)
    return (int(found[fields[0]]), int(found[fields[1]])) if found else None


@functools.lru_cache(maxsize=None)
def pdl_decode_limits(key: str | None) -> tuple[int, int] | None:
    """(largest M, most bytes of B) of the decode launches that run with PDL and early release on GPU model
    ``key``, from its table's "pdl_decode" or SYMMCOLL_PDL_DECODE_LIMITS (None: no such launches there)."""
    return _setting_limits(key, "pdl_decode", ("max_m", "max_b_bytes"), _LIMITS_OVERRIDE, "SYMMCOLL_PDL_DECODE_LIMITS",
                           "<max M>,<max bytes of B>")


# SYMMCOLL_PDL_SMALL_LIMITS="<max multiply-adds>,<max bytes of B>" stands for every table's "pdl_small" (as
# SYMMCOLL_PDL_DECODE_LIMITS for "pdl_decode").
_SMALL_OVERRIDE = os.environ.get("SYMMCOLL_PDL_SMALL_LIMITS", "")


@functools.lru_cache(maxsize=None)
def pdl_small_limits(key: str | None) -> tuple[int, int] | None:
    """(most multiply-adds M * N * K, most bytes of B) of the small products whose whole-tile launches run
    with PDL on GPU model ``key``, from its table's "pdl_small" or SYMMCOLL_PDL_SMALL_LIMITS (None: none do)."""
    return _setting_limits(key, "pdl_small", ("max_macs", "max_b_bytes"), _SMALL_OVERRIDE, "SYMMCOLL_PDL_SMALL_LIMITS",
                           "<max multiply-adds>,<max bytes of B>")
