"""``celery -A proj delayq ...``: the carrier and commands to inspect the store.

Registered through the ``celery.commands`` entry point, so every ``celery`` process imports
this module: it imports only what the command group needs, and commands import the carrier
(and with it prometheus_client) when they run.
"""

from __future__ import annotations

import getpass
import json
import logging
import sys
from datetime import datetime

import click

from .conf import SETTINGS
from .errors import DelayQError, InvalidDelay, InvalidOption
from .extension import DelayQ
from .memory import eviction_problem
from .reading import counted, datetime_of_ms


def _delayq(ctx: click.Context) -> DelayQ:
    return DelayQ.of(ctx.obj.app)


def _fail(exc: DelayQError) -> None:
    click.secho(f"error: {exc}", fg="red", err=True)
    sys.exit(1)


@click.group(name="delayq")
def delayq() -> None:
    """celery-delayq: the carrier and the delay store's contents."""


_DEFAULTS = {setting.name: setting.default for setting in SETTINGS}


def _setting(name: str) -> str:
    """An option's default as help shows it: the app's setting and its built-in value."""
    value = _DEFAULTS[name]
    shown = value if isinstance(value, bool) else f"{value:g}"
    return f"app.conf.delayq_{name} (built in: {shown})"


@delayq.command()
@click.option("--batch", type=int, default=None, show_default=_setting("claim_batch"),
              help="Jobs claimed per shard per round trip.")
@click.option("--lease", type=float, default=None, show_default=_setting("lease_seconds"),
              help="Seconds a claimed job stays leased.")
@click.option("--shard-lease", type=float, default=None,
              show_default=_setting("shard_lease_seconds"),
              help="Seconds a carrier's hold on a shard lasts without renewal.")
@click.option("--idle-timeout", type=float, default=None, show_default=_setting("idle_timeout"),
              help="Longest sleep without looking at Redis, seconds.")
@click.option("--direct/--no-direct", default=None,
              show_default=_setting("direct_promotion"),
              help="Push plain jobs onto the broker's queue lists inside the claim script.")
@click.option("--handoff-lead", type=float, default=None, show_default=_setting("handoff_lead"),
              help="Seconds before its due time a job may be handed to its queue (eta = due).")
@click.option("--metrics-port", type=int, default=None,
              help="Serve Prometheus metrics on this port (needs celery-delayq[metrics]).")
@click.option("-l", "--loglevel", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.pass_context
def carrier(ctx: click.Context, batch: int | None, lease: float | None,
            shard_lease: float | None, idle_timeout: float | None, direct: bool | None,
            handoff_lead: float | None, metrics_port: int | None, loglevel: str) -> None:
    """Promote due jobs into their Celery queues (run one or more beside beat)."""
    from .carrier import Carrier
    from .metrics import CarrierMetrics

    logging.basicConfig(level=loglevel.upper(),
                        format="[%(asctime)s: %(levelname)s/%(name)s] %(message)s")
    try:
        metrics = None
        if metrics_port is not None:
            metrics = CarrierMetrics(DelayQ.of(ctx.obj.app).store)
            metrics.serve(metrics_port)
            logging.getLogger("celery_delayq.carrier").info(
                "metrics on http://0.0.0.0:%d/metrics", metrics_port)
        Carrier(ctx.obj.app, batch=batch, lease=lease, shard_lease=shard_lease,
                idle_timeout=idle_timeout, direct=direct, handoff_lead=handoff_lead,
                metrics=metrics).run()
    except DelayQError as exc:
        _fail(exc)


@delayq.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Pending, overdue, paused, in-flight and dead jobs per shard."""
    try:
        rows = _delayq(ctx).store.stats()
    except DelayQError as exc:
        _fail(exc)
    if as_json:
        click.echo(json.dumps(rows))
        return
    click.echo(f"{'shard':>5} {'pending':>9} {'overdue':>8} {'paused':>8} {'limited':>8} "
               f"{'inflight':>8} {'dead':>6} {'journal':>8}  next due")
    for row in rows:
        click.echo(f"{row['shard']:>5} {row['pending']:>9} {row['overdue']:>8} "
                   f"{row['paused']:>8} {row['rate_limited']:>8} {row['inflight']:>8} "
                   f"{row['dead']:>6} {row['journal']:>8}  {_ms(row['next_due_ms'])}")
    click.echo(f"total pending: {sum(row['pending'] for row in rows)}{_held(rows)}")


@delayq.command()
@click.option("--max-overdue", type=int, default=1000, show_default=True,
              help="Most jobs that may be due but unclaimed.")
@click.option("--max-overdue-age", type=float, default=60.0, show_default=True,
              help="Longest a due job may wait unclaimed, seconds.")
@click.pass_context
def health(ctx: click.Context, max_overdue: int, max_overdue_age: float) -> None:
    """Exit 1 when the overdue backlog or its oldest job passes a threshold, or when Redis may
    evict keys (liveness probe)."""
    from .metrics import oldest_overdue_seconds

    try:
        store = _delayq(ctx).store
        rows = store.stats()
        problems = sorted({p for p in map(eviction_problem, store.eviction_policies()) if p})
    except DelayQError as exc:
        _fail(exc)
    overdue = sum(row["overdue"] for row in rows)
    age = oldest_overdue_seconds(rows)
    damaged = [row for row in rows if row["damaged"]]
    healthy = overdue <= max_overdue and age <= max_overdue_age and not problems and not damaged
    click.echo(f"{'ok' if healthy else 'unhealthy'}: {overdue} overdue jobs (max {max_overdue}), "
               f"oldest waiting {age:.1f}s (max {max_overdue_age:g}s)")
    held = _held(rows)
    if held:
        click.echo(f"held, not counted as overdue: {held.strip(' ()')} (`celery delayq paused` "
                   "and `celery delayq rate-limit` list the pauses and limits)")
    for problem in problems:
        click.echo(f"unsafe: {problem}")
    for row in damaged:
        click.echo(f"damaged: shard {row['shard']} is not served, {row['damaged']}; move the "
                   "key away (RENAME), then run `celery delayq check --repair`")
    sys.exit(0 if healthy else 1)


@delayq.command(name="check")
@click.option("--repair", is_flag=True,
              help="Dead-letter orphaned envelopes, remove dangling members, fix counts.")
@click.pass_context
def check_store(ctx: click.Context, repair: bool) -> None:
    """Verify the store's invariants; exit 1 when damage is left (see celery_delayq.check)."""
    from .check import KINDS, check

    try:
        reports = check(_delayq(ctx).store, repair=repair)
    except DelayQError as exc:
        _fail(exc)
    left = 0
    for report in reports:
        if report.error:
            left += 1
            click.echo(f"shard {report.shard}: cannot be checked: {report.error}")
        if not report.counts_checked:
            click.echo(f"shard {report.shard}: counts not checked, jobs changed during the "
                       "scan; run it again when the store is quiet")
        for kind in KINDS:
            found, fixed = report.found[kind], report.repaired[kind]
            if found:
                left += found - fixed
                click.echo(f"shard {report.shard}: {found} {kind.replace('_', ' ')}"
                           f"{f', {fixed} repaired' if repair else ''}; e.g. "
                           f"{', '.join(report.examples[kind])}")
    jobs, both = sum(r.jobs for r in reports), sum(r.in_both for r in reports)
    click.echo(f"{'clean' if not left else f'{left} problems left'}: "
               f"{counted(jobs, 'job')} checked on {len(reports)} shards "
               f"({both} scheduled again while in flight)")
    sys.exit(1 if left else 0)


@delayq.command(name="ls")
@click.option("--task", default=None, help="Only this task name.")
@click.option("--key", default=None, help="Only this business key.")
@click.option("--args-contains", "args_contains", default=None, metavar="JSON",
              help="Only jobs called with this argument value (JSON: 42, '\"42\"'; "
                   "text that is not JSON is a string). Reads the store until --limit match.")
@click.option("--limit", default=100, show_default=True)
@click.option("--dead", is_flag=True, help="List dead-lettered jobs instead.")
@click.pass_context
def ls(ctx: click.Context, task: str | None, key: str | None, args_contains: str | None,
       limit: int, dead: bool) -> None:
    """List pending jobs in due order (or dead letters with --dead)."""
    try:
        if dead:
            for entry in _delayq(ctx).store.dead(limit):
                click.echo(f"{entry['job_id']}  {_ms(entry['at'])}  {entry['reason']}")
            return
        jobs = _delayq(ctx).pending(task=task, key=key, limit=limit,
                                    args_contains=_json_or_text(args_contains))
    except DelayQError as exc:
        _fail(exc)
    if not jobs:
        click.echo("no pending jobs")
    for job in jobs:
        due = job.due.isoformat(timespec="milliseconds") if job.due else "-"
        click.echo(f"{due}  {job.job_id}  {job.task}  key={job.key or '-'}  queue={job.queue}"
                   + ("  (paused)" if job.paused else ""))


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
        job = _delayq(ctx).get(job_id, key=key)
    except DelayQError as exc:
        _fail(exc)
    if job is None:
        click.echo(f"no job {job_id!r} in the store (promoted, cancelled or never scheduled)")
        sys.exit(1)
    data = dict(vars(job), due=job.due.isoformat() if job.due else None)
    click.echo(json.dumps(data, indent=2, default=str))


@delayq.command()
@click.argument("job_id", required=False)
@click.option("--key", default=None, help="Cancel every pending job with this business key.")
@click.pass_context
def cancel(ctx: click.Context, job_id: str | None, key: str | None) -> None:
    """Cancel JOB_ID, or every job of --key KEY."""
    try:
        if job_id:
            outcome = _delayq(ctx).cancel_outcome(job_id, key=key, by="cli")
            click.echo(f"{job_id}: {outcome.value}")
            sys.exit(0 if outcome.name == "CANCELLED" else 1)
        if key:
            cancelled = _delayq(ctx).cancel_key(key, by="cli")
            click.echo(f"cancelled {counted(cancelled, 'job')} of key {key!r}")
            return
    except DelayQError as exc:
        _fail(exc)
    raise click.UsageError("give a JOB_ID or --key KEY")


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
    try:
        when = datetime.fromisoformat(eta) if eta is not None else None
    except ValueError:
        raise click.UsageError(f"--eta {eta!r} is not an ISO-8601 time such as "
                               "2030-01-31T08:00:00+00:00") from None
    try:
        due = _delayq(ctx).reschedule(job_id, delay=delay, eta=when, key=key)
    except InvalidDelay as exc:
        raise click.UsageError(str(exc)) from None
    except DelayQError as exc:
        _fail(exc)
    _say_due(job_id, None if due is None else due.isoformat(timespec="milliseconds"))


@delayq.command(name="run-now")
@click.argument("job_id")
@click.option("--key", default=None, help="The job's business key (finds it faster).")
@click.pass_context
def run_now(ctx: click.Context, job_id: str, key: str | None) -> None:
    """Make pending JOB_ID due now."""
    try:
        moved = _delayq(ctx).run_now(job_id, key=key)
    except DelayQError as exc:
        _fail(exc)
    _say_due(job_id, "now" if moved else None)


@delayq.command()
@click.option("--task", default=None, help="The task name, e.g. shop.tasks.check_refund.")
@click.option("--queue", default=None, help="The queue name, e.g. refunds.")
@click.pass_context
def pause(ctx: click.Context, task: str | None, queue: str | None) -> None:
    """Hold the due jobs of a task or a queue until `resume` (every carrier obeys it)."""
    try:
        _delayq(ctx).pause(task=task, queue=queue, by=_cli_user())
    except InvalidOption as exc:
        raise click.UsageError(str(exc)) from None
    except DelayQError as exc:
        _fail(exc)
    click.echo(f"paused {'task ' + task if task else 'queue ' + str(queue)}: its due jobs "
               "are held, pending, until you run `delayq resume` with the same option")


@delayq.command()
@click.option("--task", default=None, help="The task name.")
@click.option("--queue", default=None, help="The queue name.")
@click.pass_context
def resume(ctx: click.Context, task: str | None, queue: str | None) -> None:
    """End a pause: its held jobs are due again and promoted oldest first."""
    try:
        released = _delayq(ctx).resume(task=task, queue=queue, by=_cli_user())
    except InvalidOption as exc:
        raise click.UsageError(str(exc)) from None
    except DelayQError as exc:
        _fail(exc)
    click.echo(f"resumed {'task ' + task if task else 'queue ' + str(queue)}: "
               f"{counted(released, 'held job')} due again")


@delayq.command()
@click.pass_context
def paused(ctx: click.Context) -> None:
    """List the paused tasks and queues."""
    try:
        found = _delayq(ctx).paused()
    except DelayQError as exc:
        _fail(exc)
    if not found["tasks"] and not found["queues"]:
        click.echo("nothing is paused")
    for kind in ("tasks", "queues"):
        for name in found[kind]:
            click.echo(f"{kind[:-1]} {name}")


@delayq.command(name="rate-limit")
@click.argument("queue", required=False)
@click.argument("rate", required=False)
@click.pass_context
def rate_limit(ctx: click.Context, queue: str | None, rate: str | None) -> None:
    """Limit how fast QUEUE's due jobs are promoted (RATE: 200/s, 30/m, 1000/h, or off);
    without RATE show its limit, without QUEUE list every limit."""
    try:
        if queue is None or rate is None:
            limits = _delayq(ctx).rate_limits()
            for name, value in limits.items():
                if queue in (None, name):
                    click.echo(f"{name}: {value}")
            if not limits or (queue is not None and queue not in limits):
                click.echo("no rate limit" if queue else "no rate limits")
            return
        released = _delayq(ctx).set_rate_limit(queue, None if rate == "off" else rate,
                                               by=_cli_user())
    except InvalidOption as exc:
        raise click.UsageError(str(exc)) from None
    except DelayQError as exc:
        _fail(exc)
    if rate == "off":
        click.echo(f"{queue}: no rate limit; {counted(released, 'held job')} due again")
    else:
        click.echo(f"{queue}: at most {rate} promoted, shared by every carrier")


def _held(rows: list[dict]) -> str:
    """" (3 held by a pause, 5 by a rate limit)", or "" when none is held."""
    paused, limited = (sum(row[name] for row in rows) for name in ("paused", "rate_limited"))
    parts = [f"{paused} held by a pause" if paused else "",
             f"{limited} by a rate limit" if limited else ""]
    return f" ({', '.join(part for part in parts if part)})" if paused or limited else ""


def _cli_user() -> str:
    """Who ran the command, as the journal's ``by`` of a pause or resume."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no user name in this environment (a bare container)
        return "cli"


def _say_due(job_id: str, due: str | None) -> None:
    if due is None:
        click.echo(f"{job_id}: not pending (promoted, cancelled or unknown)")
        sys.exit(1)
    click.echo(f"{job_id}: due {due}")


@delayq.command()
@click.argument("job_id")
@click.pass_context
def replay(ctx: click.Context, job_id: str) -> None:
    """Put a dead-lettered job back, due now."""
    try:
        replayed = _delayq(ctx).store.replay(job_id)
    except DelayQError as exc:
        _fail(exc)
    click.echo(f"{job_id}: {'replayed' if replayed else 'no such dead job'}")
    sys.exit(0 if replayed else 1)


def _ms(ms: float | None) -> str:
    """Epoch ms as ISO-8601: "-" when absent, the number itself when it is no time."""
    at = datetime_of_ms(ms)
    if at is None:
        return "-" if ms is None else f"{ms!r} ms (no time)"
    return at.isoformat(timespec="milliseconds")


@delayq.command()
@click.option("--to", "to", required=True, type=click.Path(file_okay=False),
              help="Folder of date=YYYY-MM-DD/ partitions (created if missing).")
@click.option("--since", default=None,
              help="Start at this time (ISO-8601 or epoch ms) instead of where the last "
                   "export stopped.")
@click.option("--format", "fmt", type=click.Choice(["parquet", "jsonl"]), default="parquet",
              show_default=True, help="Parquet needs pyarrow (the spark extra).")
@click.pass_context
def export(ctx: click.Context, to: str, since: str | None, fmt: str) -> None:
    """Drain the journal streams into date-partitioned files; resumes where it stopped."""
    from .export import export_journal

    try:
        result = export_journal(_delayq(ctx).store, to, since=since, fmt=fmt)
    except DelayQError as exc:
        _fail(exc)
    for shard in result.trimmed:
        click.secho(f"warning: shard {shard}'s journal was trimmed past the last export; "
                    "some events are missing. Export more often or raise "
                    "delayq_journal_maxlen.", fg="yellow", err=True)
    click.echo(f"exported {result.events} events in {len(result.files)} files to {to}")
