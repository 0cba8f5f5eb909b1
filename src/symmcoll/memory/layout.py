"""Sizes every layer agrees on (no torch import: the device-side code reads them too)."""

# Programs a launch may have; barrier slots are (pid, src) = pid * world + src.
MAX_PROGRAMS = 1024
MAX_WORLD = 8
# Signal pad, int32 slots per rank: barrier slots, then one "announced descriptor" slot per source rank.
ANNOUNCE_SLOT = MAX_PROGRAMS * MAX_WORLD
SIGNAL_PAD_INTS = ANNOUNCE_SLOT + 64
# Error record (int32 words, host-visible): 0..5 a failure, 6..7 the interpreter's wait clock (spins of
# this launch's waits; set once they have spun SYMMCOLL_TIMEOUT_S), 8..13 argument reports.
STATUS_SPINS_WORD = 6
STATUS_DEADLINE_WORD = 7
