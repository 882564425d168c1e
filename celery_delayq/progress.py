"""The running count of a long command (replay --all, drop --all, delayq_sync --backfill)."""

from __future__ import annotations

import time
from collections.abc import Callable


class Progress:
    """Says ``"<verb> <count> so far"`` through ``say`` when called, at most once a second."""

    def __init__(self, say: Callable[[str], object], verb: str) -> None:
        self.say, self.verb, self.shown = say, verb, time.monotonic()

    def __call__(self, done: int) -> None:
        if time.monotonic() - self.shown >= 1:
            self.shown = time.monotonic()
            self.say(f"{self.verb} {done:,} so far")
