"""The running count of a long command (replay --all, drop --all, delayq_sync --backfill)."""

from __future__ import annotations

import time
from collections.abc import Callable


class Progress:
    """Says ``"<verb> <count> so far"`` through ``say`` when called, at most once a second.
    It is only information: once ``say`` fails to write (stderr closed or full), it says
    nothing more, and the command goes on."""

    def __init__(self, say: Callable[[str], object], verb: str) -> None:
        self.say: Callable[[str], object] | None = say
        self.verb, self.shown = verb, time.monotonic()

    def __call__(self, done: int) -> None:
        if self.say is not None and time.monotonic() - self.shown >= 1:
            self.shown = time.monotonic()
            try:
                self.say(f"{self.verb} {done:,} so far")
            except OSError:
                self.say = None
