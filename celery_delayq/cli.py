"""``celery -A proj delayq ...``: the carrier and commands to inspect the store.

Registered through the ``celery.commands`` entry point, so every ``celery`` process imports
this module: it imports only what the command group needs, and commands import the store
(``DelayQ``: through ``cli_group.delayq_of``), the carrier and prometheus_client when they
run.

``delayq`` is the whole group: the store-wide commands (carrier, stats, health, check,
export) are here; importing ``cli_jobs`` (ls, show, cancel, reschedule, run-now),
``cli_dead`` (replay, drop) and ``cli_holding`` (pause, resume, paused, rate-limit) adds
theirs to the group ``cli_group`` holds.
"""

from __future__ import annotations

import json
import logging
import sys

import click

from . import cli_dead, cli_holding, cli_jobs  # noqa: F401  (their commands join delayq)
from .cli_group import FiniteFloat, ctrl_c_stops, delayq, delayq_of, fail, ms_text
from .errors import DelayQError
from .reading import counted, shown
from .settings import SETTINGS

__all__ = ["delayq"]


_DEFAULTS = {setting.name: setting.default for setting in SETTINGS}


def _setting(name: str, text: str) -> str:
    """An option's help ending with its default: the app's setting and its built-in value
    (click's show_default would put it in parentheses of its own)."""
    value = _DEFAULTS[name]
    shown = value if isinstance(value, bool) else f"{value:g}"
    return f"{text} [default: app.conf.delayq_{name} (built in: {shown})]"


@delayq.command()
@click.option("--batch", type=int, default=None,
              help=_setting("claim_batch", "Jobs claimed per shard per round trip."))
@click.option("--lease", type=float, default=None,
              help=_setting("lease_seconds", "Seconds a claimed job stays leased."))
@click.option("--shard-lease", type=float, default=None,
              help=_setting("shard_lease_seconds",
                            "Seconds a carrier's hold on a shard lasts without renewal."))
@click.option("--idle-timeout", type=float, default=None,
              help=_setting("idle_timeout", "Longest sleep without looking at Redis, seconds."))
@click.option("--direct/--no-direct", default=None,
              help=_setting("direct_promotion", "Push plain jobs onto the broker's queue "
                                                "lists inside the claim script."))
@click.option("--handoff-lead", type=float, default=None,
              help=_setting("handoff_lead", "Seconds before its due time a job may be handed "
                                            "to its queue (eta = due)."))
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="Serve Prometheus metrics on this port (needs celery-delayq[metrics]).")
@click.option("--metrics-host", default="0.0.0.0", show_default=True,
              help="Address the metrics are served on (127.0.0.1: this host only).")
@click.option("-l", "--loglevel", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.pass_context
def carrier(ctx: click.Context, batch: int | None, lease: float | None,
            shard_lease: float | None, idle_timeout: float | None, direct: bool | None,
            handoff_lead: float | None, metrics_port: int | None, metrics_host: str,
            loglevel: str) -> None:
    """Promote due jobs into their Celery queues (run one or more beside beat)."""
    from .carrier import Carrier
    from .metrics import CarrierMetrics

    logging.basicConfig(level=loglevel.upper(),
                        format="[%(asctime)s: %(levelname)s/%(name)s] %(message)s")
    try:
        metrics = None
        if metrics_port is not None:
            metrics = CarrierMetrics(delayq_of(ctx).store)
            metrics.serve(metrics_port, metrics_host)
            logging.getLogger("celery_delayq.carrier").info(
                "metrics on http://%s:%d/metrics", metrics_host, metrics_port)
        Carrier(ctx.obj.app, batch=batch, lease=lease, shard_lease=shard_lease,
                idle_timeout=idle_timeout, direct=direct, handoff_lead=handoff_lead,
                metrics=metrics).run()
    except DelayQError as exc:
        fail(exc)


@delayq.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Pending, overdue, paused, in-flight and dead jobs per shard."""
    try:
        rows = delayq_of(ctx).store.stats()
    except DelayQError as exc:
        fail(exc)
    if as_json:
        click.echo(json.dumps(rows))
        return
    click.echo(f"{'shard':>5} {'pending':>9} {'overdue':>8} {'paused':>8} {'limited':>8} "
               f"{'inflight':>8} {'dead':>6} {'journal':>8}  next due")
    for row in rows:
        click.echo(f"{row['shard']:>5} {row['pending']:>9} {row['overdue']:>8} "
                   f"{row['paused']:>8} {row['rate_limited']:>8} {row['inflight']:>8} "
                   f"{row['dead']:>6} {row['journal']:>8}  {ms_text(row['next_due_ms'])}")
    click.echo(f"total pending: {sum(row['pending'] for row in rows)}{_held(rows)}")


@delayq.command()
@click.option("--max-overdue", type=click.IntRange(min=0), default=1000, show_default=True,
              help="Most jobs that may be due but unclaimed.")
@click.option("--max-overdue-age", type=FiniteFloat(min=0), default=60.0,
              show_default=True,
              help="Longest a due job may wait unclaimed, seconds.")
@click.pass_context
def health(ctx: click.Context, max_overdue: int, max_overdue_age: float) -> None:
    """Exit 1 when the overdue backlog or its oldest job passes a threshold, when Redis may
    evict keys or a key of the store is damaged (liveness probe); say so when Redis keeps no
    append-only file."""
    from .memory import eviction_problem
    from .metrics import oldest_overdue_seconds
    from .persistence import persistence_problem

    try:
        store = delayq_of(ctx).store
        rows = store.stats()
        problems = sorted({p for p in map(eviction_problem, store.eviction_policies()) if p})
        not_durable = sorted({p for p in map(persistence_problem, store.persistence()) if p})
        store_keys = store.damaged_store_keys()
    except DelayQError as exc:
        fail(exc)
    overdue = sum(row["overdue"] for row in rows)
    age = oldest_overdue_seconds(rows)
    damaged = [row for row in rows if row["damaged"]]
    exhausted = [row for row in rows if row["journal_exhausted"]]
    healthy = (overdue <= max_overdue and age <= max_overdue_age and not problems
               and not damaged and not store_keys and not exhausted)
    click.echo(f"{'ok' if healthy else 'unhealthy'}: {overdue} overdue jobs (max {max_overdue}), "
               f"oldest waiting {age:.1f}s (max {max_overdue_age:g}s)")
    held = _held(rows)
    if held:
        click.echo(f"held, not counted as overdue: {held.strip(' ()')} (`celery delayq paused` "
                   "and `celery delayq rate-limit` list the pauses and limits)")
    for problem in problems:
        click.echo(f"unsafe: {problem}")
    for problem in not_durable:
        click.echo(f"not durable: {problem}")
    for row in damaged:
        click.echo(f"damaged: shard {row['shard']} is not served, {shown(row['damaged'])}; "
                   "move the key away (RENAME), then run `celery delayq check --repair`")
    for problem in store_keys:
        click.echo(f"damaged: {shown(problem)}; move the key away (RENAME): carriers serve "
                   "every shard without sharing them out meanwhile")
    for row in exhausted:
        click.echo(f"damaged: the journal of shard {row['shard']} has no stream id left (its "
                   "last id is the largest there is): the shard is served, its events are "
                   "lost; move the key away (RENAME)")
    sys.exit(0 if healthy else 1)


@delayq.command(name="check")
@click.option("--repair", is_flag=True,
              help="Dead-letter orphaned envelopes, remove dangling members, fix counts.")
@click.pass_context
def check_store(ctx: click.Context, repair: bool) -> None:
    """Verify the store's invariants; exit 1 when damage is left (see celery_delayq.check)."""
    from .check import KINDS, check

    try:
        with ctrl_c_stops("what it repaired is repaired, and it checks every shard again"
                          if repair else "it changed nothing"):
            reports = check(delayq_of(ctx).store, repair=repair)
    except DelayQError as exc:
        fail(exc)
    left = 0
    for report in reports:
        if report.error:
            left += 1
            click.echo(f"shard {report.shard}: cannot be checked: {shown(report.error)}")
        if not report.counts_checked:
            click.echo(f"shard {report.shard}: counts not checked: jobs changed during the "
                       "scan, or the store keeps no journal (delayq_journal_maxlen = 0); run "
                       "it again when the store is quiet")
        for kind in KINDS:
            found, fixed = report.found[kind], report.repaired[kind]
            if found:
                left += found - fixed
                click.echo(f"shard {report.shard}: {found} {kind.replace('_', ' ')}"
                           f"{f', {fixed} repaired' if repair else ''}; e.g. "
                           f"{shown(', '.join(report.examples[kind]))}")
    jobs, both = sum(r.jobs for r in reports), sum(r.in_both for r in reports)
    click.echo(f"{'clean' if not left else f'{left} problems left'}: "
               f"{counted(jobs, 'job')} checked on {len(reports)} shards "
               f"({both} scheduled again while in flight)")
    sys.exit(1 if left else 0)


def _held(rows: list[dict]) -> str:
    """" (3 held by a pause, 5 by a rate limit)", or "" when none is held."""
    paused, limited = (sum(row[name] for row in rows) for name in ("paused", "rate_limited"))
    parts = [f"{paused} held by a pause" if paused else "",
             f"{limited} by a rate limit" if limited else ""]
    return f" ({', '.join(part for part in parts if part)})" if paused or limited else ""


@delayq.command()
@click.option("--to", "to", required=True, type=click.Path(file_okay=False),
              help="Folder of date=YYYY-MM-DD/ partitions (created if missing).")
@click.option("--since", default=None,
              help="Start at this time (ISO-8601 or epoch ms) instead of where the last "
                   "export stopped, which stays as it was for the next export without it.")
@click.option("--format", "fmt", type=click.Choice(["parquet", "jsonl"]), default="parquet",
              show_default=True, help="Parquet needs pyarrow (the spark extra).")
@click.pass_context
def export(ctx: click.Context, to: str, since: str | None, fmt: str) -> None:
    """Drain the journal streams into date-partitioned files; resumes where it stopped."""
    from .export import export_journal

    def trimmed(shard: int) -> None:  # said at once: the run may fail past the gap
        click.secho(f"warning: shard {shard}'s journal was trimmed past the last entry "
                    "exported (or Redis lost it); some events are missing. Export more "
                    "often or raise delayq_journal_maxlen.", fg="yellow", err=True)

    try:
        with ctrl_c_stops("what it wrote is kept, and it goes on from the last batch it "
                          "saved" if since is None else "what it wrote is kept, and it "
                          "writes the same files again"):
            result = export_journal(delayq_of(ctx).store, to, since=since, fmt=fmt,
                                    on_trimmed=trimmed)
    except DelayQError as exc:
        fail(exc)
    except OSError as exc:  # what is written is kept, its position saved: run it again
        fail(DelayQError(f"cannot write the export under {to}: {exc.strerror or exc}; what "
                         "was written before is kept and not exported again"))
    click.echo(f"exported {result.events} events in {len(result.files)} files to {to}")
    for shard, why in result.damaged.items():
        click.secho(f"error: shard {shard}'s journal cannot be read, nothing of it exported: "
                    f"{shown(why)}", fg="red", err=True)
    if result.damaged:
        sys.exit(1)
