"""What the one-shot delayq commands say when Ctrl-C or the database stops them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.core.management.base import CommandError
from django.db import DatabaseError

from celery_delayq.interrupts import Count, interrupted, said

__all__ = ["Count", "stops_said"]


@contextlib.contextmanager
def stops_said(command: str, done: object, rerun: str) -> Iterator[None]:
    """Turn Ctrl-C, or a database error (locked, away), inside into a ``CommandError``
    saying what was ``done`` (read when it stops) and why running ``command`` again is
    safe (``rerun``); Ctrl-C's exits 130, as a shell's does."""
    try:
        yield
    except KeyboardInterrupt:
        raise CommandError(interrupted(done, command, rerun), returncode=130) from None
    except DatabaseError as exc:
        raise CommandError(f"the database failed: {exc}{said(done)}; once it answers, "
                           f"run {command} again, which is safe: {rerun}") from exc
