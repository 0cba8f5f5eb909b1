"""Sizes every layer agrees on (no torch import: the device-side code reads them too)."""

# Programs a launch may have; barrier slots are (pid, src) = pid * world + src.
MAX_PROGRAMS = 1024
MAX_WORLD = 8
# Signal pad, int32 slots per rank: barrier slots, then one "announced descriptor" slot per source rank.
ANNOUNCE_SLOT = MAX_PROGRAMS * MAX_WORLD
SIGNAL_PAD_INTS = ANNOUNCE_SLOT + 64
