"""The fused bench under two or more environment settings side by side (scripts/gpu_check.sh's ``fused-env``
stage, which writes DIR/<i>/env.txt and the bench's JSONs per setting): per (op, shape, implementation) the
median us and the paired ratio to cuBLAS of every setting, and each setting's time over the first's. Rows
with an error in any setting say so. Writes DIR/fused_env_compare.json.

    python3 benchmarks/fused_env_compare.py DIR
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path


def _load(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def settings(root: Path) -> list[tuple[str, dict]]:
    """[(setting, {(op, shape, implementation): row})] of DIR's numbered folders, in order."""
    found = []
    for folder in sorted((p for p in root.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)):
        env = (folder / "env.txt").read_text().strip() if (folder / "env.txt").exists() else folder.name
        rows = {}
        for path in sorted(folder.glob("*-ws*.json*")):
            for row in _load(path)["rows"]:
                rows[(row["op"], "x".join(map(str, row["shape"])), row["implementation"])] = row
        found.append((env, rows))
    return found


def compare(root: Path) -> list[dict]:
    runs = settings(root)
    if len(runs) < 2:
        raise SystemExit(f"{root}: fewer than two settings to compare")
    out = []
    for key in runs[0][1]:
        rows = [rows.get(key) for _, rows in runs]
        if any(r is None for r in rows):
            continue
        first = rows[0]["median_us"]
        out.append(dict(op=key[0], shape=key[1], implementation=key[2],
                        us=[r["median_us"] for r in rows],
                        x_cublas=[r.get("x_cublas_paired") or r.get("x_cublas") for r in rows],
                        over_first=[r["median_us"] / first if first else None for r in rows],
                        errors=[r.get("error") for r in rows]))
    return out


def main(argv: list[str]) -> None:
    root = Path(argv[1] if len(argv) > 1 else ".")
    names = [env for env, _ in settings(root)]
    rows = compare(root)
    print("settings: " + " | ".join(f"[{i}] {name}" for i, name in enumerate(names)))
    for r in rows:
        cells = "  ".join(f"[{i}] {us:9.1f} us x{x:.3f}" if x else f"[{i}] {us:9.1f} us"
                          for i, (us, x) in enumerate(zip(r["us"], r["x_cublas"])))
        ratios = " ".join(f"{v:.3f}" for v in r["over_first"][1:])
        error = "  ERROR " + "; ".join(str(e) for e in r["errors"] if e) if any(r["errors"]) else ""
        print(f"{r['op'][:22]:22s} {r['shape']:18s} {r['implementation'][:30]:30s} {cells}  /[0] {ratios}{error}")
    (root / "fused_env_compare.json").write_text(json.dumps(dict(settings=names, rows=rows), indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv)
