"""What the one-shot delayq commands say when Ctrl-C or the database stops them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from django.core.management.base import CommandError
from django.db import DatabaseError

from celery_delayq.progress import Progress


class Count:
    """A command's running count: said at most once a second, kept for when it stops."""

    def __init__(self, say: Callable[[str], object], verb: str) -> None:
        self.done, self.verb, self.progress = 0, verb, Progress(say, verb)

    def __call__(self, done: int) -> None:
        self.done = done
        self.progress(done)

    def __str__(self) -> str:
        return f"{self.verb} {self.done:,} before it"


@contextlib.contextmanager
def stops_said(command: str, done: object, rerun: str) -> Iterator[None]:
    """Turn Ctrl-C, or a database error (locked, away), inside into a ``CommandError``
    saying what was ``done`` (read when it stops) and why running ``command`` again is
    safe (``rerun``); Ctrl-C's exits 130, as a shell's does."""
    try:
        yield
    except KeyboardInterrupt:
        raise CommandError(f"interrupted{_said(done)}; running {command} again is safe: "
                           f"{rerun}", returncode=130) from None
    except DatabaseError as exc:
        raise CommandError(f"the database failed: {exc}{_said(done)}; once it answers, "
                           f"run {command} again, which is safe: {rerun}") from exc


def _said(done: object) -> str:
    return f" ({done})" if str(done) else ""
