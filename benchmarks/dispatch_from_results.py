"""A dispatch table (``algorithm="auto"``) from committed ``symmcoll bench`` results, keeping a base table's
rules for every (op, world size, dtype) the results do not measure.

    PYTHONPATH=src python3 benchmarks/dispatch_from_results.py --base src/symmcoll/data/dispatch_h200.json \\
        --out src/symmcoll/data/dispatch_h100.json benchmarks/results/2026-11-27-multi-gpu-fix-h100x4/2026*.json

``symmcoll tune`` measures and writes a table in one go on the GPU machine; this builds one from a bench run
already committed (the same rule: dispatch.table_from_results), for a GPU model whose machine time went to
the bench itself.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from symmcoll import dispatch
from symmcoll.bench import results


def merged(paths: list[str], base: dispatch.Table) -> dispatch.Table:
    """The rules of the results in ``paths``, then ``base``'s for every case they do not measure."""
    found = [results.load(p) for p in paths]
    prov = found[0].provenance
    table = dispatch.table_from_results(
        found, f"symmcoll bench, {prov.created_utc}, {prov.gpu_name or prov.device_type} x{prov.gpu_count}, "
               f"git {prov.git_sha[:7]}, graph timing ({', '.join(sorted(Path(p).name for p in paths))})")
    measured = {(r.op, r.world_size, r.dtype) for r in table.rules}
    kept = tuple(r for r in base.rules if (r.op, r.world_size, r.dtype) not in measured)
    source = table.source + (f"; {', '.join(sorted({f'{r.op} ws{r.world_size}' for r in kept}))} from "
                             f"{base.source}" if kept else "")
    return dispatch.Table(table.rules + kept, source)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="symmcoll bench result files (.json)")
    parser.add_argument("--base", type=Path, required=True, help="the table whose other rules are kept")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    table = merged(args.results, dispatch.Table.from_json(args.base.read_text()))
    args.out.write_text(table.to_json() + "\n")
    print(f"{args.out}: {len(table.rules)} rules; {table.source}")
