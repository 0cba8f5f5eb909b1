"""Do two source trees compile their kernels to the same sm_90 PTX? (CPU only; no GPU needed.)

Used to show that a change leaves the kernels bit-for-bit alone (e.g. the debug switches of
symmcoll.debug_switches, off): run once per tree, each with its own src and tests on PYTHONPATH and a
fresh Triton cache, then compare the two files.

    TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=/tmp/main/src:/tmp/main/tests \\
        python3 benchmarks/ptx_identity.py --out main.json --labels all_reduce.low_latency all_reduce.sentinel
    TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=src:tests python3 benchmarks/ptx_identity.py --out mine.json --labels ...
    python3 benchmarks/ptx_identity.py --compare main.json mine.json

The specs are the compile checks' (tests/kernel_specs.py: the launches every registered algorithm makes,
recorded on meta tensors), selected by label prefix (all of them without --labels). Line information
is switched off (TRITON_DISABLE_LINE_INFO=1, set here before triton compiles) so that moved source
lines and different checkout paths do not count as differences; what remains is the code.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys


def _digests(labels: list[str]) -> dict[str, str]:
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    import kernel_specs  # the compile checks' spec recorder, from the tree's tests/ on PYTHONPATH

    specs = kernel_specs.compile_specs()
    chosen = [s for s in specs if not labels or s.label.startswith(tuple(labels))]
    found = {}
    for i, spec in enumerate(chosen):
        ptx = kernel_specs.compile_ptx(spec)
        found[spec.name] = hashlib.sha256(ptx.encode()).hexdigest()
        print(f"[{i + 1}/{len(chosen)}] {spec.name[:110]} {found[spec.name][:12]}", flush=True)
    return found


def _compare(before_path: str, after_path: str) -> int:
    before, after = (json.load(open(p)) for p in (before_path, after_path))
    same = sorted(k for k in before if after.get(k) == before[k])
    differ = sorted(k for k in before if k in after and after[k] != before[k])
    only = sorted(set(before) ^ set(after))
    print(f"{len(same)} kernels identical, {len(differ)} differ, {len(only)} in one file only")
    for name in differ:
        print("DIFFERS", name)
    for name in only:
        print("ONLY IN ONE", name)
    return 0 if not differ and not only else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labels", nargs="*", default=[], help="spec label prefixes (default: every spec)")
    parser.add_argument("--out", help="write {spec: sha256 of its PTX} here")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        return _compare(*args.compare)
    found = _digests(args.labels)
    with open(args.out, "w") as f:
        json.dump(found, f, indent=1, sort_keys=True)
    print(f"{len(found)} PTX digests written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
