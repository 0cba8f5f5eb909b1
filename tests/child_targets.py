"""Targets for processes the tests spawn (not a test module; standard library only, so a child starts fast)."""

import os
import time


def die_holding(send) -> None:
    """A child that holds its end of the pipe and dies without a word (as a crash would)."""
    os._exit(3)


def hold_silently(send, seconds: float = 60.0) -> None:
    """A child that holds its end of the pipe and never answers."""
    time.sleep(seconds)
