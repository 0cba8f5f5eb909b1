"""The GPU's state around a bench cell's timed rounds, read through NVML: SM clock, temperature, power
draw and the reasons the clocks are held down (power cap, thermal slowdown, ...).

Why: on one H100 the GEMM grid's large-M cells slowed 20-30% within a cell, cuBLAS as well as ours, and
the paired ratio moved with it (2026-11-27-tune-fused-h100, 70b-tp4 o M=16384: 1.06 in the cool rounds,
1.11-1.15 in the hot ones). Whether the GPU sat at its power cap or heated up there was not recorded;
bench/gemm.py now reads this module's state before a cell's first round and after its last.

Optional and harmless: NVML comes from the ``pynvml`` module (nvidia-ml-py, what torch.cuda's
``clock_rate`` / ``temperature`` / ``power_draw`` use), imported only when asked; where it is missing or
fails, ``Reader.read`` gives None (the bench records nothing) and ``Reader.unavailable`` says why once.
No call of this module raises. Every read is a handful of driver queries (tens of microseconds), made
outside the timed replays. NVML's power draw on Ampere and later is an average over about a second.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Callable

# NVML's clocks-event (throttle) reason bits (nvmlClocksEventReason* / nvmlClocksThrottleReason*).
THROTTLE_BITS = (
    (0x1, "idle"), (0x2, "app clocks"), (0x4, "power cap"), (0x8, "HW slowdown"), (0x10, "sync boost"),
    (0x20, "SW thermal"), (0x40, "HW thermal"), (0x80, "power brake"), (0x100, "display clocks"),
)
# The reasons that mean the GPU is held down by its power or its heat (what the grid's summary counts).
POWER_REASONS = frozenset({"power cap", "power brake"})
THERMAL_REASONS = frozenset({"SW thermal", "HW thermal", "HW slowdown"})
# NVML's enum values, where the module lacks the names.
NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = 1, 0


def reason_names(mask: int) -> list[str]:
    """The names of the reason bits set in ``mask``, unknown bits as hex."""
    names = [name for bit, name in THROTTLE_BITS if mask & bit]
    unknown = mask & ~sum(bit for bit, _ in THROTTLE_BITS)
    return names + ([hex(unknown)] if unknown else [])


def _or_none(query: Callable[[], object]):
    try:
        return query()
    except Exception:  # noqa: BLE001 - one field NVML does not give here (e.g. NotSupported): left None
        return None


def _sm_mhz(nvml, handle) -> int | None:
    return _or_none(lambda: int(nvml.nvmlDeviceGetClockInfo(handle, getattr(nvml, "NVML_CLOCK_SM", NVML_CLOCK_SM))))


@dataclass(frozen=True)
class Reader:
    """One GPU's NVML handle (``nvml``: the pynvml module), or why there is none (``unavailable``)."""

    nvml: object | None = None
    handle: object | None = None
    unavailable: str | None = None

    def read(self) -> dict | None:
        """The GPU's state now: ``sm_mhz``, ``temp_c``, ``power_w``, ``throttle_mask`` and ``throttle``
        (the set bits' names); a field NVML does not give is None; None without NVML."""
        if self.handle is None:
            return None
        nvml, handle = self.nvml, self.handle
        reasons = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                   or getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
        mask = _or_none(lambda: int(reasons(handle))) if reasons else None
        power_mw = _or_none(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        return dict(
            sm_mhz=_sm_mhz(nvml, handle),
            temp_c=_or_none(lambda: int(nvml.nvmlDeviceGetTemperature(
                handle, getattr(nvml, "NVML_TEMPERATURE_GPU", NVML_TEMPERATURE_GPU)))),
            power_w=None if power_mw is None else round(power_mw / 1000.0, 1),
            throttle_mask=mask, throttle=None if mask is None else reason_names(mask))

    def meter(self) -> dict | None:
        """What bench/gemm_energy.py reads around each side's timed replays: NVML's total energy counter
        (``mj``: millijoules since the driver loaded, Volta and later; None where NVML does not give it),
        the SM clock (``sm_mhz``), the host time of the counter's read (``t_s``, time.perf_counter) and
        what the two queries cost (``read_us``); None without NVML."""
        if self.handle is None:
            return None
        nvml, handle = self.nvml, self.handle
        started = time.perf_counter()
        mj = _or_none(lambda: int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)))
        read_at = time.perf_counter()
        mhz = _sm_mhz(nvml, handle)
        return dict(t_s=read_at, mj=mj, sm_mhz=mhz, read_us=round((time.perf_counter() - started) * 1e6, 1))


def nvml_handle(device, nvml) -> object:
    """The NVML handle of torch's ``device``: torch's own mapping (CUDA_VISIBLE_DEVICES, ordinals or
    UUIDs) where this torch has it, else the device's UUID."""
    import torch
    try:
        return nvml.nvmlDeviceGetHandleByIndex(torch.cuda._get_nvml_device_index(device))
    except Exception:  # noqa: BLE001 - a torch without the private helper: match by UUID instead
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        return nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")


def open_reader(device) -> Reader:
    """A Reader for torch's ``device``; never raises (a missing pynvml, a failed init or a CPU device give
    a Reader whose ``unavailable`` says why)."""
    if getattr(device, "type", None) != "cuda":
        return Reader(unavailable=f"not a CUDA device ({device})")
    try:
        import pynvml as nvml
    except Exception as exc:  # noqa: BLE001 - ImportError or a broken install alike
        return Reader(unavailable=f"pynvml not importable ({type(exc).__name__}: {exc})")
    try:
        nvml.nvmlInit()
        return Reader(nvml, nvml_handle(device, nvml))
    except Exception as exc:  # noqa: BLE001
        return Reader(unavailable=f"NVML failed ({type(exc).__name__}: {exc})")


@functools.lru_cache(maxsize=None)
def _reader_of(device_type: str, index: int | None) -> Reader:
    import torch
    return open_reader(torch.device(device_type, index) if index is not None else torch.device(device_type))


def reader_for(device) -> Reader:
    """The process's one Reader of ``device`` (NVML initialised once)."""
    return _reader_of(getattr(device, "type", str(device)), getattr(device, "index", None))


def describe(state: dict | None) -> str:
    """One state, for a log line: '1980 MHz 45 C 312 W power cap' (fields NVML did not give left out)."""
    if not state:
        return "no GPU state"
    parts = [f"{state[key]:g} {unit}" for key, unit in (("sm_mhz", "MHz"), ("temp_c", "C"), ("power_w", "W"))
             if state.get(key) is not None]
    return " ".join(parts + [", ".join(state.get("throttle") or ["no throttle"])])


def announce(reader: Reader) -> str:
    """The bench's one line on what it records: why nothing, or the state now."""
    if reader.unavailable:
        return f"GPU state (clock, temperature, power, throttle reasons) not recorded: {reader.unavailable}"
    return f"GPU state recorded around each cell's rounds through NVML; now {describe(reader.read())}"


def held_down(state: dict | None) -> tuple[bool, bool]:
    """(power, thermal): whether ``state``'s reasons include a power or a thermal one."""
    names = set((state or {}).get("throttle") or ())
    return bool(names & POWER_REASONS), bool(names & THERMAL_REASONS)


def tag(around: dict | None) -> str | None:
    """A cell's 'before -> after' for its log line, e.g. 'hot: 1605->1410 MHz 52->61 C 698 W, power cap';
    'gpu: ...' where no power or thermal reason was set after the rounds; None without a state."""
    if not around or not around.get("after"):
        return None
    before, after = around.get("before") or {}, around["after"]

    def span(key: str, unit: str) -> str | None:
        if after.get(key) is None:
            return None
        head = f"{before[key]:g}->" if before.get(key) is not None else ""
        return f"{head}{after[key]:g} {unit}"
    spans = [s for s in (span("sm_mhz", "MHz"), span("temp_c", "C")) if s]
    if after.get("power_w") is not None:
        spans.append(f"{after['power_w']:g} W")
    hot = any(held_down(after))
    reasons = [r for r in after.get("throttle") or () if r != "idle"] or ["no throttle"]
    return f"{'hot' if hot else 'gpu'}: {' '.join(spans)}, {', '.join(reasons)}"


def count_ended_held(rows: list[dict]) -> dict | None:
    """Of the rows with a recorded ``gpu_state``: how many there are, how many ended their rounds with a
    power or a thermal reason set, and how often each reason was set at the end; None where no row has
    one (NVML was missing)."""
    ends = [r["gpu_state"]["after"] for r in rows if (r.get("gpu_state") or {}).get("after")]
    if not ends:
        return None
    counts: dict[str, int] = {}
    for state in ends:
        for name in state.get("throttle") or ():
            counts[name] = counts.get(name, 0) + 1
    held = [held_down(s) for s in ends]
    return dict(cells=len(ends), ended_power_cap=sum(p for p, _ in held), ended_thermal=sum(t for _, t in held),
                ended_reasons=counts)
