"""``celery delayq ls | show | cancel | reschedule | run-now``: one job at a time, or a
listing of them."""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime

import click

from .cli_group import (
    cli_user,
    counting,
    ctrl_c_said,
    delayq,
    delayq_of,
    fail,
    ms_text,
    registered,
    warn,
)
from .errors import DelayQError, InvalidDelay
from .reading import FORBIDDEN, counted, iso_time, shown


@delayq.command(name="ls")
@click.option("--task", default=None, help="Only this task name.")
@click.option("--key", default=None, help="Only this business key.")
@click.option("--args-contains", "args_contains", default=None, metavar="JSON",
              help="Only jobs called with this argument value (JSON: 42, '\"42\"'; "
                   "text that is not JSON is a string). Reads the store until --limit match.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(min=1))
@click.option("--dead", is_flag=True, help="List dead-lettered jobs instead.")
@click.pass_context
def ls(ctx: click.Context, task: str | None, key: str | None, args_contains: str | None,
       limit: int, dead: bool) -> None:
    """List pending jobs in due order (or dead letters, newest first, with --dead)."""
    if key == "":
        raise click.UsageError("--key is empty: give the business key whose jobs to list")
    try:
        if dead:
            _ls_dead(ctx, task, key, args_contains, limit)
            return
        jobs = delayq_of(ctx).pending(task=task, key=key, limit=limit,
                                    args_contains=_json_or_text(args_contains))
    except DelayQError as exc:
        fail(exc)
    if not jobs:
        click.echo("no pending jobs")
        if task is not None and not registered(ctx, task):
            warn(f"no task {shown(task)} is registered in this app (a task of another app? "
                 "a typo?)")
    for job in jobs:
        due = job.due.isoformat(timespec="milliseconds") if job.due else "-"
        click.echo(f"{due}  {shown(job.job_id)}  {shown(job.task)}  "
                   f"key={shown(job.key or '-')}  queue={shown(job.queue)}"
                   + (f"  ({job.held})" if job.held else ""))  # paused, rate limit


def _ls_dead(ctx: click.Context, task: str | None, key: str | None,
             args_contains: str | None, limit: int) -> None:
    """List the newest ``limit`` dead letters of ``task`` and ``key`` (None: any)."""
    if args_contains is not None:
        raise click.UsageError("--args-contains searches pending jobs only; with --dead, "
                               "select by --task or --key")
    from .store.dead_letters import of_task_and_key

    store = delayq_of(ctx).store
    if task is None and key is None:
        letters = store.dead(limit)
    else:  # every letter read, then the newest of those selected
        letters = [entry for entry in store.dead(sys.maxsize)
                   if of_task_and_key(entry["envelope"], task, key)][:limit]
    if not letters:
        click.echo("no dead letters")
    for entry in letters:
        click.echo(f"{shown(entry['job_id'])}  {ms_text(entry['at'])}  {shown(entry['reason'])}")


def _json_or_text(value: str | None) -> object:
    """A command-line value as JSON (``42``, ``"42"``, ``true``), else as the text itself."""
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError:
        return value


@delayq.command()
@click.argument("job_id")
@click.option("--key", default=None, help="The job's business key (finds it faster).")
@click.pass_context
def show(ctx: click.Context, job_id: str, key: str | None) -> None:
    """Show one job as JSON."""
    try:
        job = delayq_of(ctx).get(job_id, key=key)
    except DelayQError as exc:
        fail(exc)
    if job is None:
        click.echo(f"no job {shown(repr(job_id))} in the store (promoted, cancelled or never "
                   "scheduled)", err=True)
        sys.exit(1)
    data = dict(vars(job), due=job.due.isoformat() if job.due else None)
    click.echo(_json_shown(json.dumps(data, indent=2, default=str, ensure_ascii=False)))


#: What ``show`` escapes in its JSON: reading.FORBIDDEN, and lone surrogates (no UTF-8).
_UNSHOWN = re.compile(rf"{FORBIDDEN.pattern}|[\ud800-\udfff]")


def _json_shown(text: str) -> str:
    """JSON text as ``show`` prints it: other scripts' characters as they are, those no
    terminal may get raw as JSON escapes (``\\u202e``), so it stays JSON."""
    return "\n".join(_UNSHOWN.sub(lambda found: f"\\u{ord(found[0]):04x}", line)
                     for line in text.split("\n"))  # (its own line breaks kept)


@delayq.command()
@click.argument("job_id", required=False)
@click.option("--key", default=None,
              help="Without JOB_ID: cancel every pending job of KEY. (With JOB_ID it is not "
                   "needed: the job is looked for on every shard.)")
@click.pass_context
def cancel(ctx: click.Context, job_id: str | None, key: str | None) -> None:
    """Cancel JOB_ID, or every pending job of --key KEY (their results REVOKED)."""
    if key == "" and not job_id:
        raise click.UsageError("--key is empty: give the business key whose jobs to cancel")
    try:
        if job_id:
            outcome = delayq_of(ctx).cancel_outcome(job_id, key=key, by=cli_user())
            click.echo(f"{shown(job_id)}: {outcome.value}")
            sys.exit(0 if outcome.name == "CANCELLED" else 1)
        if key:
            _cancel_key(ctx, key)
            return
    except DelayQError as exc:
        fail(exc)
    raise click.UsageError("give a JOB_ID or --key KEY")


def _cancel_key(ctx: click.Context, key: str) -> None:
    """Cancel every pending job of ``key``, chunk by chunk, with progress on stderr."""
    count = counting("cancelled")
    with ctrl_c_said(count, "each job cancelled has its result REVOKED; the key's other "
                            "jobs are still pending, and it cancels them"):
        cancelled = delayq_of(ctx).cancel_key(key, by=cli_user(), progress=count)
    click.echo(f"cancelled {counted(cancelled, 'job')} of key {shown(repr(key))}")


@delayq.command()
@click.argument("job_id")
@click.option("--delay", type=float, default=None, help="Due this many seconds from now.")
@click.option("--eta", default=None, metavar="ISO-8601",
              help="Due at this time, with its offset: 2030-01-31T08:00:00+00:00.")
@click.option("--key", default=None, help="The job's business key (finds it faster).")
@click.pass_context
def reschedule(ctx: click.Context, job_id: str, delay: float | None, eta: str | None,
               key: str | None) -> None:
    """Give pending JOB_ID a new due time."""
    if (delay is None) == (eta is None):
        raise click.UsageError("give --delay SECONDS or --eta ISO-8601, one of them")
    when = None if eta is None else _aware(eta)
    try:
        due = delayq_of(ctx).reschedule(job_id, delay=delay, eta=when, key=key)
    except InvalidDelay as exc:
        raise click.UsageError(str(exc)) from None
    except DelayQError as exc:
        fail(exc)
    _say_due(job_id, None if due is None else due.isoformat(timespec="milliseconds"))


def _aware(eta: str) -> datetime:
    """``--eta``'s time: ISO-8601 with an offset ("Z" too, which Python 3.10 reads only
    as "+00:00")."""
    try:
        when = iso_time(eta)
    except ValueError:
        raise click.UsageError(f"--eta {eta!r} is not an ISO-8601 time such as "
                               "2030-01-31T08:00:00+00:00") from None
    if when.utcoffset() is None:
        raise click.UsageError(f"--eta {eta!r} has no offset: add one, e.g. "
                               f"{when.isoformat()}+00:00 (UTC)")
    return when


@delayq.command(name="run-now")
@click.argument("job_id")
@click.option("--key", default=None, help="The job's business key (finds it faster).")
@click.pass_context
def run_now(ctx: click.Context, job_id: str, key: str | None) -> None:
    """Make pending JOB_ID due now."""
    try:
        moved = delayq_of(ctx).run_now(job_id, key=key)
    except DelayQError as exc:
        fail(exc)
    _say_due(job_id, "now" if moved else None)


def _say_due(job_id: str, due: str | None) -> None:
    if due is None:
        click.echo(f"{shown(job_id)}: not pending (promoted, cancelled or unknown)")
        sys.exit(1)
    click.echo(f"{shown(job_id)}: due {due}")
