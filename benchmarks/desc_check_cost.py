"""What the call-descriptor checks cost on the device, per launch, in CUDA graphs, on one GPU.

    PYTHONPATH=src python3 benchmarks/desc_check_cost.py --out $OUT/desc_check_cost.json
    PYTHONPATH=old_main/src python3 benchmarks/desc_check_cost.py --variants none,library --out before.json

The checks, kernel side:
  * barrier kernels: every signal *is* the descriptor (CAS 0 -> desc, CAS desc -> 0): a barrier that
    carried a constant instead would run the same instructions. Nothing to measure.
  * barrier-free kernels (sentinel, quantized, the fused ops' slots): ``language.open_slots`` loads
    (program 0) every peer's pad and slot region with the launch's other first loads; ``post_call``
    announces the descriptor into every peer's pad and posts the epoch-tagged header
    ``(epoch << 32) | desc``; program 0's first wait polls the peers' headers together with its data
    (``language.checks_headers``).

Measured: a probe kernel built from exactly those language functions, polling words already there,
in variants (numbered, each checked to return the words it polled before timing):
  0 none          no announce, no header, no header poll: the baseline
  1 run 1         the code of run 1 (2026-11-24): announce and post_header each loading its table and
                  storing before anything after them could issue; every program polls the headers
  2 library       open_slots + post_call, program 0 polls the headers (what the kernels do): the verdict
  3 no announce   the library without the pad announce (program 0 loads one table, makes one store)
  4 one table     the library with the slot regions' bases computed from the pads' (one address table:
                  regions sit at one offset of each other in every rank's allocation)
  5 branch        the library with program 0's stores behind a scalar branch (programs != 0 skip them)
  6 split         the library with program 0's first wait a code path of its own (check 1) and the other
                  programs' without any of the header poll (check 0): what programs != 0 pay for it
Variants 3-6 are candidates, built from the language functions of this tree. Run on another tree's
``src`` (PYTHONPATH) with ``--variants none,library``, it measures that tree's checks: the tree before a
change, in the same GPU run (``--before`` prints the two side by side).
The "peers" are this process's own buffers (every entry of the address tables points at them), so no
other rank is needed and nothing waits. World 2: grids of 1, 132 and 528 programs of 512 words, every variant;
worlds 4 and 8 (``header_state``'s vector form): 1 program, and 132 and 528 at world 8, none, library and split. N launches
captured in one CUDA graph, replayed, timed with CUDA events, variants interleaved over rounds; cost
per launch = (variant - none) / launches. Target: at most 0.1 us per call.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict

import torch
import triton
import triton.language as tl

from symmcoll.bench.timing import event_times_us
from symmcoll.language import (EMPTY, HEADER_WORDS, MAX_WORLD, PHASES, announce, announce_at, checks_headers,
                               launch_epoch, open_slots, peer_ptr, post_call, post_header, post_header_at,
                               program0_peer_bases, wait_filled)
from symmcoll.memory.layout import SIGNAL_PAD_INTS

BLOCK = 512
VARIANTS = ("none", "run 1", "library", "no announce", "one table", "branch", "split")
SPLIT = 6
LIBRARY = 2
# The slot region's offset from the pad in the probe's one allocation (int32 words, page-aligned), as a
# workspace lays its regions out in every rank's allocation.
SLOTS_AT = -(-SIGNAL_PAD_INTS // 1024) * 1024


@triton.jit
def probe_kernel(
    # workspace-like: signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the slot region's address table; the launch-epoch table; where the words go
    desc, slot_ptrs_dev, epochs_ptr, out_ptr, n_words,
    # variant 4: the slot region's offset from the pad (int32 words; a workspace would pass it)
    slots_at,
    WORLD: tl.constexpr, BLOCK: tl.constexpr, VARIANT: tl.constexpr, ROW: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_words
    check = 0
    if VARIANT == 2 or VARIANT == 5 or VARIANT == 6:
        epoch, base, region, headers, pads, peer_headers = open_slots(slot_ptrs_dev, epochs_ptr, signal_pad_ptrs_dev,
                                                                      desc, rank, WORLD, 1, ROW)
        if VARIANT == 2:
            post_call(pads, peer_headers, epoch, desc, rank, WORLD)
        else:
            if pid == 0:
                post_call(pads, peer_headers, epoch, desc, rank, WORLD)
        check = checks_headers(1)
    else:
        epoch = launch_epoch(epochs_ptr)
        phase = epoch % PHASES
        region = peer_ptr(slot_ptrs_dev, rank, tl.int32)
        headers = region.to(tl.pointer_type(tl.int64)) + phase * MAX_WORLD
        base = HEADER_WORDS + phase * WORLD * ROW
        if VARIANT == 1:
            if pid == 0:
                announce(signal_pad_ptrs_dev, desc, rank, WORLD)
                post_header(slot_ptrs_dev, phase, epoch, desc, rank, WORLD)
            check = 1
        if VARIANT == 3:
            post_header_at(program0_peer_bases(slot_ptrs_dev, rank, WORLD, tl.int64), phase, epoch, desc, rank, WORLD)
            check = checks_headers(1)
        if VARIANT == 4:
            pads = program0_peer_bases(signal_pad_ptrs_dev, rank, WORLD, tl.int32)
            announce_at(pads, desc, rank, WORLD)
            post_header_at((pads + slots_at).to(tl.pointer_type(tl.int64)), phase, epoch, desc, rank, WORLD)
            check = checks_headers(1)
    if VARIANT == 6:
        if pid == 0:
            words, budget = wait_filled(region + base + offs, mask, EMPTY, max_spins, status_ptr, rank, 1, desc,
                                        headers, epoch, 1, WORLD)
        else:
            words, budget = wait_filled(region + base + offs, mask, EMPTY, max_spins, status_ptr, rank, 1, desc,
                                        headers, epoch, 0, WORLD)
    else:
        words, budget = wait_filled(region + base + offs, mask, EMPTY, max_spins, status_ptr, rank, 1, desc, headers,
                                    epoch, check, WORLD)
    if budget > 0:
        tl.store(out_ptr + offs, words, mask=mask)


def _setup(world: int, programs: int):
    dev = torch.device("cuda")
    n_words = programs * BLOCK
    # One allocation, the pad first and the slot region SLOTS_AT words after it (variant 4 relies on it).
    space = torch.zeros(SLOTS_AT + HEADER_WORDS.value + PHASES.value * world * n_words, dtype=torch.int32, device=dev)
    pad, slots = space[:SIGNAL_PAD_INTS], space[SLOTS_AT:]
    # Every phase's slots hold words already; every header of this launch's phase is this call's.
    slots.fill_(7)
    epochs = torch.zeros(1024, dtype=torch.int32, device=dev)  # no end_launch: every launch is epoch 1
    epoch, desc = 1, 0x1235
    headers = slots[:HEADER_WORDS.value].view(torch.int64).view(PHASES.value, MAX_WORLD.value)
    headers[epoch % PHASES.value] = (epoch << 32) | desc
    tables = {name: torch.tensor([t.data_ptr()] * world, dtype=torch.int64, device=dev)
              for name, t in (("pad", pad), ("slots", slots))}
    status = torch.zeros(16, dtype=torch.int32, device=dev)
    out = torch.zeros(n_words, dtype=torch.int32, device=dev)
    args = (tables["pad"].data_ptr(), status.data_ptr(), 1 << 20, 0, desc, tables["slots"].data_ptr(), epochs, out,
            n_words, SLOTS_AT)
    return args, (space, tables, status, out, epochs)


def _time(world: int, programs: int, variant: int, launches: int, replays: int) -> dict:
    args, keep = _setup(world, programs)
    status, out = keep[2], keep[3]
    meta = dict(WORLD=world, BLOCK=BLOCK, VARIANT=variant, ROW=programs * BLOCK, num_warps=4)
    probe_kernel[(programs,)](*args, **meta)
    torch.cuda.synchronize()
    what = f"probe world {world}, {programs} programs, variant {variant} ({VARIANTS[variant]})"
    assert int(status[0]) == 0 and bool((out == 7).all()), f"{what}: wrong words or a failed wait"
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(launches):
                probe_kernel[(programs,)](*args, **meta)
    graph.replay()
    torch.cuda.synchronize()
    times = event_times_us(graph.replay, replays, per=launches)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert int(status[0]) == 0 and bool((out == 7).all()), f"{what}: wrong after replays"
    return {"world": world, "programs": programs, "variant": variant, "name": VARIANTS[variant],
            "us_per_launch": statistics.median(times), "p20_us": sorted(times)[len(times) // 5],
            "p80_us": sorted(times)[4 * len(times) // 5]}


# (world, programs): every variant at world 2; at worlds 4 and 8 (header_state's vector form) the baseline,
# the library and split.
CASES = ((2, 1), (2, 132), (2, 528), (4, 1), (8, 1), (8, 132), (8, 528))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--launches", type=int, default=200)
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="names, comma-separated (none and library "
                        "always run)")
    parser.add_argument("--before", default=None, help="the JSON of a run on the tree before: printed beside")
    args = parser.parse_args(argv)
    chosen = sorted({0, LIBRARY} | {VARIANTS.index(name) for name in args.variants.split(",") if name})
    before = {}
    if args.before:
        with open(args.before) as f:
            before = {(v["world"], v["programs"]): v["cost_us"] for v in json.load(f)["verdicts"]}
    from symmcoll.bench import provenance
    rows, verdicts = [], []
    for world, programs in CASES:
        variants = chosen if world == 2 else [v for v in chosen if v in (0, LIBRARY, SPLIT)]
        runs = {}
        for _ in range(args.rounds):  # interleaved rounds: the median of each variant
            for variant in variants:
                runs.setdefault(variant, []).append(_time(world, programs, variant, args.launches, args.replays))
        median = {v: statistics.median(r["us_per_launch"] for r in runs[v]) for v in runs}
        costs = {VARIANTS[v]: round(median[v] - median[0], 4) for v in runs if v}
        rows += [r for v in runs for r in runs[v]]
        cost = costs[VARIANTS[LIBRARY]]
        verdicts.append({"world": world, "programs": programs, "without_us": round(median[0], 4),
                         "with_us": round(median[LIBRARY], 4), "cost_us": cost, "within_0.1_us": cost <= 0.1,
                         "cost_us_by_variant": costs})
        was = f" (the tree before: {before[world, programs]:+.3f})" if (world, programs) in before else ""
        print(f"world {world}, {programs:3d} programs: {median[0]:.3f} us without, {median[LIBRARY]:.3f} us with the "
              f"checks: {cost:+.3f} us per launch{was} ({'within' if cost <= 0.1 else 'ABOVE'} 0.1 us); by variant: "
              + ", ".join(f"{k} {c:+.3f}" for k, c in costs.items()), flush=True)
    result = {"provenance": asdict(provenance.collect("cuda")), "block_words": BLOCK, "launches_per_graph":
              args.launches, "replays": args.replays, "rounds": args.rounds, "variants": VARIANTS,
              "verdict_variant": VARIANTS[LIBRARY], "verdicts": verdicts, "rows": rows,
              "before": args.before and {"file": args.before,
                                         "cost_us": [{"world": w, "programs": p, "cost_us": c}
                                                     for (w, p), c in before.items()]}}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0 if all(v["within_0.1_us"] for v in verdicts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
