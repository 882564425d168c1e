"""A stop request that a signal handler may make.

``threading.Event.set`` takes a lock; a SIGTERM handler runs in the main thread between two
bytecodes, possibly while that thread holds the same lock inside ``Event.wait``, and then
waits for itself forever. A plain flag, polled in short sleeps, cannot deadlock.
"""

from __future__ import annotations

import time

_SLICE = 0.25  # longest uninterrupted sleep, so a stop is seen promptly


class StopFlag:
    """Set once by :meth:`set` (from any thread or a signal handler), polled by the loop."""

    def __init__(self) -> None:
        self.requested = False

    def set(self) -> None:
        self.requested = True

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``, in slices; return early once a stop is requested."""
        deadline = time.monotonic() + seconds
        while not self.requested and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, _SLICE))
