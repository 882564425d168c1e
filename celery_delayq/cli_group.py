"""The ``celery delayq`` click group and what its commands share.

Every ``celery`` process imports this (through ``cli.py``, the ``celery.commands`` entry
point), so it imports only what the group needs and touches no app: a command reaches the
app's ``DelayQ`` when it runs.

Commands print every string read from the store (task and queue names, keys, job ids,
reasons) and every error through ``reading.shown``: stored by an older version or written
into Redis by hand, none reaches the terminal with its escape sequences or line breaks.
"""

from __future__ import annotations

import contextlib
import getpass
import math
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click

from .errors import DelayQError
from .interrupts import Count, interrupted, said
from .reading import datetime_of_ms, shown

if TYPE_CHECKING:
    from .extension import DelayQ


@click.group(name="delayq")
def delayq() -> None:
    """celery-delayq: the carrier and the delay store's contents."""


def delayq_of(ctx: click.Context) -> DelayQ:
    """The app's DelayQ, imported here: every ``celery`` process loads the command group."""
    from .extension import DelayQ

    return DelayQ.of(ctx.obj.app)


def fail(exc: DelayQError) -> None:
    click.secho(f"error: {shown(str(exc))}", fg="red", err=True)
    sys.exit(1)


class FiniteFloat(click.FloatRange):
    """A FloatRange that refuses nan and infinity."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def ms_text(ms: float | None) -> str:
    """Epoch ms as ISO-8601: "-" when absent, the number itself when it is no time."""
    at = datetime_of_ms(ms)
    if at is None:
        return "-" if ms is None else shown(f"{ms!r} ms (no time)")
    return at.isoformat(timespec="milliseconds")


def cli_user() -> str:
    """Who ran the command, as the journal's ``by`` of what it changed."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no user name in this environment (a bare container)
        return "cli"


def counting(verb: str) -> Count:
    """A long command's running count, its progress said on stderr."""
    return Count(lambda message: click.echo(message, err=True), verb)


@contextlib.contextmanager
def ctrl_c_said(count: Count, rerun: str) -> Iterator[None]:
    """Within: Ctrl-C stops the command between two steps of ``count``; it then says the
    exact count, that the same command again is safe (``rerun``: why), and exits 130. A
    DelayQError says the same count and rerun after its own message, and exits 1."""
    try:
        with count.ctrl_c_between_steps():
            yield
    except KeyboardInterrupt:
        click.secho(interrupted(count, "the same command", rerun), fg="yellow", err=True)
        sys.exit(130)
    except DelayQError as exc:
        fail(DelayQError(f"{exc}{said(count)}; running the same command again is safe: "
                         f"{rerun}"))


@contextlib.contextmanager
def ctrl_c_stops(rerun: str) -> Iterator[None]:
    """Within: Ctrl-C stops the command at once; it says that the same command again is
    safe (``rerun``: why), and exits 130."""
    try:
        yield
    except KeyboardInterrupt:
        click.secho(interrupted("", "the same command", rerun), fg="yellow", err=True)
        sys.exit(130)


def registered(ctx: click.Context, task: str) -> bool:
    """Whether the app registers ``task``, once its task modules are imported."""
    app = ctx.obj.app
    app.loader.import_default_modules()
    return task in app.tasks


def warn(message: str) -> None:
    click.secho(f"warning: {message}", fg="yellow", err=True)
