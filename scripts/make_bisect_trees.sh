#!/usr/bin/env bash
# Build bis/<sha>/src (the package source of each commit, from git archive) for the multi-diagnose stage of
# scripts/gpu_check.sh, which runs benchmarks/multi_gpu_probe.py on each with PYTHONPATH=bis/<sha>/src.
#   scripts/make_bisect_trees.sh [sha ...]
# Default: 70f4eb8 (the last tree measured fast on 4 H100s) and the 15 commits after it up to 1935f76 (the
# first measured slow). bis/ is ignored by git (.git/info/exclude): carry it to the GPU machine (carry=["bis"]).
set -euo pipefail
cd "$(dirname "$0")/.."
shas=${*:-$(git rev-list --reverse 70f4eb8^..1935f76)}
for sha in $shas; do
  short=$(git rev-parse --short=7 "$sha")
  rm -rf "bis/$short"
  mkdir -p "bis/$short"
  git archive "$short" src | tar x -C "bis/$short"
  echo "bis/$short/src"
done
git check-ignore -q bis || echo "warning: bis/ is not ignored by git here; add /bis/ to .git/info/exclude" >&2
du -sh bis | cut -f1 | sed 's/^/bis total: /'
