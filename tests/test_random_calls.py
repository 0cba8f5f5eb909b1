"""The property test: 2,000 random calls over world sizes 2, 3 and 4 (1200, 400, 400) (tests/random_calls.py draws,
runs and judges them), every one equal to symmcoll.reference's answer or, where the ranks' calls
differ, SymmcollMismatchError on every rank naming the field and a rank whose call differs. A failure
names its seed and call: ``SYMMCOLL_PROPERTY_SEED=<seed>`` draws the same calls again, and
``SYMMCOLL_PROPERTY_CALLS`` scales how many (e.g. 10 for a longer search)."""

import os

import pytest

import random_calls

SEED = int(os.environ.get("SYMMCOLL_PROPERTY_SEED", "24"))
SCALE = float(os.environ.get("SYMMCOLL_PROPERTY_CALLS", "1"))
CALLS = {2: 1200, 3: 400, 4: 400}
BATCH = 250  # calls per round trip to the ranks


@pytest.mark.parametrize("world", sorted(CALLS))
def test_random_calls(pools, world):
    count = int(CALLS[world] * SCALE)
    failures = []
    for first in range(0, count, BATCH):
        outcomes = pools(world).run(random_calls.batch, SEED, first, min(BATCH, count - first), timeout=900)
        failures += random_calls.verdict(SEED, world, first, outcomes)
    assert not failures, f"{len(failures)} of {count} calls failed:\n" + "\n".join(failures[:10])
