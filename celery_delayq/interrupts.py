"""What a long command says when Ctrl-C stops it: the exact count it got to, and why
running it again is safe (the CLI's ``cancel --key``, ``replay --all``, ``drop --all``,
``resume``; the Django app's ``delayq_sync``, ``delayq_reconcile``, ``delayq_prune``); the
CLI's ``check`` and ``export`` say why without a count (``cli_group.ctrl_c_stops``)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

from .progress import Progress


class Count:
    """A command's running count: said at most once a second (:class:`Progress`), kept
    exact for when it stops. Inside :meth:`ctrl_c_between_steps`, Ctrl-C stops the
    command at its next count, so a step (a chunk of work, told by one call) is never
    cut in two."""

    def __init__(self, say: Callable[[str], object], verb: str) -> None:
        self.done, self.verb, self.progress = 0, verb, Progress(say, verb)
        self.pressed = self.cut = False

    def __call__(self, done: int) -> None:
        self.done = done
        if self.pressed:
            raise KeyboardInterrupt
        self.progress(done)

    def __str__(self) -> str:
        if self.cut:
            return f"{self.verb} at least {self.done:,} before it: a second Ctrl-C cut a step short"
        return f"{self.verb} {self.done:,} before it"

    @contextlib.contextmanager
    def ctrl_c_between_steps(self) -> Iterator[None]:
        """Within: a first Ctrl-C stops the command at its next count, a second at once.
        Only the main thread receives signals: elsewhere Ctrl-C is left as it is."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, self._press)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def _press(self, signum: int, frame: FrameType | None) -> None:
        if self.pressed:
            self.cut = True
            raise KeyboardInterrupt
        self.pressed = True


def interrupted(done: object, command: str, rerun: str) -> str:
    """What a command stopped by Ctrl-C says: what was ``done`` and why running
    ``command`` again is safe (``rerun``)."""
    return f"interrupted{said(done)}; running {command} again is safe: {rerun}"


def said(done: object) -> str:
    """`` (<done>)``, or nothing when ``done`` says nothing."""
    return f" ({done})" if str(done) else ""
