"""``celery delayq replay | drop``: what an operator does with dead letters, one by id or
all of them (``--all``, narrowed by ``--task`` and ``--reason-contains``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from .cli_group import cli_user, counting, ctrl_c_said, delayq, delayq_of, fail
from .errors import DelayQError, JobExists
from .reading import counted, shown

if TYPE_CHECKING:
    from .store import Store


def _one_or_all(command: Callable[..., Any]) -> Callable[..., Any]:
    """The arguments both commands take: JOB_ID, or --all with its filters."""
    for option in reversed((
            click.argument("job_id", required=False),
            click.option("--all", "every", is_flag=True,
                         help="Every dead letter (or those of --task / --reason-contains)."),
            click.option("--task", default=None, help="With --all: only this task's."),
            click.option("--reason-contains", "reason", default=None, metavar="TEXT",
                         help="With --all: only those whose reason contains TEXT."))):
        command = option(command)
    return command


def _check_one_or_all(job_id: str | None, every: bool, task: str | None,
                      reason: str | None) -> None:
    if (job_id is None) == (not every) or (job_id and (task or reason)):
        raise click.UsageError("give one JOB_ID or --all (which --task and "
                               "--reason-contains narrow)")


@delayq.command()
@_one_or_all
@click.pass_context
def replay(ctx: click.Context, job_id: str | None, every: bool, task: str | None,
           reason: str | None) -> None:
    """Put a dead-lettered job back, due now; or with --all, every one selected."""
    _check_one_or_all(job_id, every, task, reason)
    try:
        store = delayq_of(ctx).store
        if job_id is not None:
            replayed = _replay_one(store, job_id)
            click.echo(f"{shown(job_id)}: {'replayed' if replayed else 'no such dead job'}")
            sys.exit(0 if replayed else 1)
        count = counting("replayed")
        with ctrl_c_said(count, "what it replayed is replayed, the rest stays dead, and it "
                                "goes on with them"):
            done = store.replay_dead(task=task, reason=reason, progress=count)
    except DelayQError as exc:
        fail(exc)
    kept = [f"{counted(done.live, 'job')} whose id a live job has"] if done.live else []
    if done.unreadable:
        kept.append(f"{done.unreadable:,} unreadable (see `delayq ls --dead`)")
    click.echo(f"replayed {counted(done.replayed, 'dead job')}"
               + (f"; kept dead: {', '.join(kept)}" if kept else ""))
    sys.exit(1 if kept else 0)


def _replay_one(store: Store, job_id: str) -> bool:
    """Replay ``job_id``; a live job of that id is refused, saying what the operator can do."""
    try:
        return store.replay(job_id)
    except JobExists:
        raise DelayQError(f"a live job has the id {job_id!r}, so its dead letter stays dead: "
                          f"cancel it first (`delayq cancel {job_id}`) or wait until it has "
                          "run, then replay") from None


@delayq.command()
@_one_or_all
@click.option("--yes", is_flag=True, help="With --all: do not ask first.")
@click.pass_context
def drop(ctx: click.Context, job_id: str | None, every: bool, task: str | None,
         reason: str | None, yes: bool) -> None:
    """Give up a dead-lettered job for good (journaled as cancelled); or with --all, every
    one selected (without --task or --reason-contains, unreadable ones too)."""
    _check_one_or_all(job_id, every, task, reason)
    by = f"{cli_user()}: dropped dead letter"
    try:
        store = delayq_of(ctx).store
        if job_id is not None:
            dropped = store.drop(job_id, by=by)
            click.echo(f"{shown(job_id)}: {'dropped' if dropped else 'no such dead job'}")
            sys.exit(0 if dropped else 1)
        if not yes:
            click.confirm("Drop every dead letter selected, for good?", abort=True)
        count = counting("dropped")
        with ctrl_c_said(count, "what it dropped is gone, the rest stays dead, and it goes "
                                "on with them"):
            done = store.drop_dead(task=task, reason=reason, by=by, progress=count)
    except DelayQError as exc:
        fail(exc)
    click.echo(f"dropped {counted(done, 'dead job')}")
