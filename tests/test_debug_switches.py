"""The diagnostic switches of symmcoll.debug_switches: off by default, rejected when malformed, and on
they do what they say (no announce, no header, the error record in the rank's own memory, one
allocation per region) while every collective stays exact and every wait bounded. That they change no
kernel when off is shown on the compiled PTX (benchmarks/ptx_identity.py, benchmarks/multi_gpu_regression.md)."""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import symmcoll
from symmcoll import debug_switches, launch, reference
from symmcoll.language import MAX_WORLD
from symmcoll.memory.layout import ANNOUNCE_SLOT

import rank_checks
from conftest import DEVICE

ALL_ON = {"SYMMCOLL_DEBUG_NO_ABORT_CHECK": "1", "SYMMCOLL_DEBUG_ABORT_CHECK_SPINS": "3",
          "SYMMCOLL_DEBUG_NO_HEADERS": "1", "SYMMCOLL_DEBUG_NO_ANNOUNCE": "1",
          "SYMMCOLL_DEBUG_STATUS_ON_DEVICE": "1", "SYMMCOLL_DEBUG_SEPARATE_REGIONS": "1"}


def _import_switches(env: dict) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SYMMCOLL_DEBUG_")}
    return subprocess.run([sys.executable, "-c", "from symmcoll import debug_switches as d; print(d.active())"],
                          env={**clean, **env}, capture_output=True, text=True, timeout=120)


def test_switches_are_off_unless_set():
    if any(k.startswith("SYMMCOLL_DEBUG_") for k in os.environ):
        pytest.skip("this process runs with debug switches set")
    assert debug_switches.active() == {}
    assert _import_switches({}).stdout.strip() == "{}"
    on = _import_switches(ALL_ON)
    assert on.returncode == 0, on.stderr
    assert on.stdout.strip() == ("{'NO_ABORT_CHECK': True, 'ABORT_CHECK_SPINS': 3, 'NO_HEADERS': True, "
                                 "'NO_ANNOUNCE': True, 'STATUS_ON_DEVICE': True, 'SEPARATE_REGIONS': True}")


@pytest.mark.parametrize("env", [{"SYMMCOLL_DEBUG_NO_HEADERS": "yes"}, {"SYMMCOLL_DEBUG_ABORT_CHECK_SPINS": "0"},
                                 {"SYMMCOLL_QUANT_CONFIG": "4096,264"}, {"SYMMCOLL_MRS_GREEDY_PIECES": "on"}])
def test_malformed_switch_is_refused_at_import(env):
    result = _import_switches(env)
    assert result.returncode != 0
    assert next(iter(env)) in result.stderr


ALGORITHMS = ("low_latency", "sentinel_one_shot", "sentinel_two_shot", "one_shot")


def _calls_with_every_switch_on():
    ws = symmcoll.get_workspace()
    rank, world = dist.get_rank(), dist.get_world_size()
    for call in range(2):
        for algorithm in ALGORITHMS:
            for numel in (1, 4099):
                x = rank_checks.rank_coded(numel, torch.bfloat16, rank, call)
                rank_checks.assert_close(symmcoll.all_reduce(x, algorithm=algorithm), reference.all_reduce(x),
                                         f"{algorithm} numel {numel} call {call}", exact=True)
    rank_checks.assert_slots_empty()
    # STATUS_ON_DEVICE: the kernels got the record in this rank's own memory, which stayed clean.
    assert ws.status_device is not None and ws.status_ptr == ws.status_device.data_ptr() != ws.status.data_ptr()
    record = ws.device_record()  # words 6-7: the interpreter's wait clock, not failures
    assert record[:6] == [0] * 6 and record[8:] == [0] * (len(record) - 8), record
    # SEPARATE_REGIONS: regions do not share an allocation.
    storages = {name: region.local.untyped_storage().data_ptr() for name, region in ws.regions.items()}
    assert len(set(storages.values())) == len(storages), storages
    dist.barrier()
    # NO_ANNOUNCE: no peer stored its descriptor into my pad; NO_HEADERS: no header in the LL region.
    announced = ws.signal_pad[ANNOUNCE_SLOT:ANNOUNCE_SLOT + world].tolist()
    headers = ws.region("low_latency.slots").local[: 2 * MAX_WORLD.value * 8].view(torch.int64).tolist()
    dist.barrier()
    return announced, headers


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU: the GPU's switches are judged by benchmarks/multi_gpu_probe.py")
def test_every_switch_on_keeps_collectives_exact(monkeypatch):
    for key, value in ALL_ON.items():
        monkeypatch.setenv(key, value)  # the rank processes import symmcoll with these set
    results = launch.run(_calls_with_every_switch_on, 2, device="cpu", timeout=600)
    for announced, headers in results:
        assert announced == [0, 0]
        assert headers == [0] * (2 * MAX_WORLD.value)


@pytest.mark.parametrize("env, spins", [({}, 1 << 16), ({"TRITON_INTERPRET": "1"}, 64),
                                        ({"SYMMCOLL_DEBUG_ABORT_CHECK_SPINS": "64"}, 64)])
def test_compiled_waits_look_at_the_host_record_rarely(env, spins):
    """A compiled wait reads the pinned-host error record once per 65536 spins, not 64 (each look is a
    PCIe read; at 64 they made the barrier-free all-reduces 25-400x slow on 4 GPUs); the interpreter
    keeps 64, and the switch brings the old value back for a before/after run."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SYMMCOLL_DEBUG_") and k != "TRITON_INTERPRET"}
    code = "from symmcoll.language import signals; print(signals.ABORT_CHECK_SPINS.value)"
    proc = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip()) == spins
