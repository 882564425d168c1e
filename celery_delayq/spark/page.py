"""The report as one self-contained HTML page: charts first, then tables in containers that
scroll rather than widen the page."""

from __future__ import annotations

import html
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..events import Event
from ..reading import datetime_of_ms
from . import charts

if TYPE_CHECKING:
    from .report import Report

_CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;padding:1.5rem;max-width:1100px;
color:#222}
h1{font-size:1.5rem}h2{font-size:1.15rem;margin-top:2.2rem;border-bottom:1px solid #ddd}
.muted{color:#666}.chart{margin:1rem 0}
.scroll{overflow:auto;width:fit-content;max-width:100%;max-height:28rem;
border:1px solid #e5e5e5;margin:.5rem 0}
table{border-collapse:collapse;font-size:12px}
td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th{position:sticky;top:0;background:#f4f4f4;z-index:1}
.text{text-align:left;white-space:normal;overflow-wrap:anywhere;min-width:12rem;max-width:26rem}
td:first-child{position:sticky;left:0;background:#fff}
.cards{display:flex;flex-wrap:wrap;gap:.75rem}
.card{border:1px solid #ddd;border-radius:6px;padding:.5rem .9rem;min-width:9rem}
.card b{display:block;font-size:1.4rem}
"""
_TEXT = frozenset({"task", "reason", "job", "event"})  # left-aligned, wrapping columns
#: Columns of the report's tables, counts of one journal event each (but cancel_rate).
_COUNTS = [*(e.value for e in (Event.SCHEDULED, Event.PROMOTED, Event.STARTED, Event.SUCCEEDED,
                                Event.FAILED, Event.IGNORED, Event.RETRIED, Event.REVOKED,
                                Event.CANCELLED, Event.DEAD)),
           "cancel_rate"]
_LATENESS = [f"{kind}_late_{q}_ms" for kind in ("promote", "start")
             for q in ("p50", "p95", "p99", "max")]
_OUTCOMES = tuple(e.value for e in (Event.SUCCEEDED, Event.FAILED, Event.IGNORED,
                                     Event.RETRIED, Event.REVOKED, Event.CANCELLED, Event.DEAD))
_VOLUME = tuple(e.value for e in (Event.SCHEDULED, Event.PROMOTED, Event.SUCCEEDED,
                                   Event.FAILED, Event.RETRIED, Event.DEAD))


def render(report: Report) -> str:
    """The whole page for ``report``."""
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>celery-delayq report</title><style>{_CSS}</style>{charts.script()}</head><body>
<h1>celery-delayq report</h1>
{_summary(report)}
<h2>Backlog at the export</h2>{_backlog(report)}
<h2>Lateness over time</h2>{_lateness_charts(report)}
<h2>Volume and outcomes</h2>{_volume_charts(report)}
<h2>Dead letters</h2>{_dead(report)}
<h2>Promoted, never started</h2>{_never_started(report)}
<h2>Per task</h2>{_table(report.by_task, ["task", *_COUNTS, *_LATENESS])}
<h2>Per task and {report.bucket}</h2>
{_table(report.over_time, ["task", "bucket", *_COUNTS, *_LATENESS])}
<h2>Slowest jobs</h2>{_slowest(report)}
</body></html>
"""


def _summary(report: Report) -> str:
    span = (f"from {_when(report.first_ms)} to {_when(report.last_ms)} "
            f"({_duration(report.last_ms - report.first_ms)})"
            if report.first_ms is not None and report.last_ms is not None else "none")
    return f"""<p class="muted">{report.events:,} journal events from
{html.escape(report.source)}, {span}; generated
{datetime.now(timezone.utc).isoformat(timespec="seconds")}.</p>
<p>Buckets: one {report.bucket} (events spanning under three hours are counted per minute,
longer spans per hour). Times are UTC. Lateness is event time &minus; due time on Redis's
clock, in milliseconds: <em>promote</em> when the carrier published the task,
<em>start</em> when a worker began it. Percentiles are exact.</p>"""


def _backlog(report: Report) -> str:
    backlog = report.backlog
    if backlog is None:
        return ('<p class="muted">No backlog snapshot beside these events (each '
                '<code>delayq export</code> writes one into <code>_backlog/</code>).</p>')

    cards = "".join(
        f'<div class="card"><b>{backlog.total(name):,}</b>{label}</div>'
        for name, label in (("pending", "pending"), ("overdue", "due, not yet claimed"),
                            ("inflight", "claimed, being published"),
                            ("dead", "dead letters stored")))
    tasks = [{"task": task, "jobs": jobs} for task, jobs in
             sorted(backlog.tasks.items(), key=lambda item: (-item[1], item[0]))]
    return f"""<p>When the export began ({_when(backlog.at_ms)}, Redis's clock):</p>
<div class="cards">{cards}</div>
<p>Jobs stored per task (pending or being published):</p>{_table(tasks, ["task", "jobs"])}
<details><summary>Per shard</summary>
{_table(backlog.shards, ["shard", "pending", "overdue", "inflight", "dead"])}</details>"""


def _lateness_charts(report: Report) -> str:
    axis = f"Time (UTC), per {report.bucket}"
    parts = []
    for kind, label in (("promote", "Promote"), ("start", "Start")):
        times = [r["bucket"] for r in report.overall]
        parts.append(charts.over_time(
            f"{kind}-lateness", f"{label} lateness, every task", "Lateness (ms)", axis,
            {f"p{q}": (times, [r[f"{kind}_late_p{q}_ms"] for r in report.overall])
             for q in (50, 95, 99)}))
        per_task: dict[str, tuple[list, list]] = {}
        for row in report.over_time:
            times, values = per_task.setdefault(row["task"], ([], []))
            times.append(row["bucket"])
            values.append(row[f"{kind}_late_p95_ms"])
        parts.append(charts.over_time(
            f"task-{kind}-lateness", f"{label} lateness per task (p95)", "p95 lateness (ms)",
            axis, per_task))
    return "".join(f'<div class="chart">{part}</div>' for part in parts)


def _volume_charts(report: Report) -> str:
    times = [r["bucket"] for r in report.overall]
    volume = charts.over_time(
        "volume", f"Events per {report.bucket}", "Events", f"Time (UTC), per {report.bucket}",
        {name: (times, [r[name] for r in report.overall]) for name in _VOLUME})
    outcomes = charts.grouped_bars(
        "outcomes", "Outcomes per task", "Events", "Task", [r["task"] for r in report.by_task],
        {name: [r[name] for r in report.by_task]
         for name in _OUTCOMES})
    return f"""<div class="chart">{volume}</div><div class="chart">{outcomes}</div>
<p class="muted">"retried" counts attempts that asked for a retry; the job's later attempt
ends in succeeded or failed, so the bars stand side by side, not stacked.</p>"""


def _dead(report: Report) -> str:
    if not report.dead:
        return "<p>No job was dead-lettered in these events.</p>"
    rows = [dict(r, last=_when(r["last_ms"])) for r in report.dead]
    return ("<p>Jobs the carrier could not publish, or calls out of retries: listed by "
            "<code>celery delayq ls --dead</code>, put back by <code>celery delayq replay"
            "</code>.</p>" + _table(rows, ["task", "reason", "dead", "replayed", "last"],
                                    {"replayed": "replayed since", "last": "last (UTC)"}))


def _never_started(report: Report) -> str:
    if not report.workers_journal:
        return ("<p class='muted'>No started events in these events: workers journal them "
                "when the app runs <code>DelayQ(app)</code> with delayq_worker_events on "
                "(the default). Without them, jobs that never started cannot be told.</p>")
    if not report.never_started:
        return "<p>Every job promoted at least a minute before the export has started.</p>"
    end = report.export_ms
    by_task = [dict(r, oldest=_when(r["oldest_ms"]), waited=_duration(end - r["oldest_ms"]))
               for r in report.never_started_by_task]
    jobs = [dict(r, promoted=_when(r["promoted_ms"]), waited=_duration(end - r["promoted_ms"]))
            for r in report.never_started]
    return f"""<p>Published to the broker at least a minute before the export, with no
started event since: look for a queue no worker consumes, or lost messages.</p>
{_table(by_task, ["task", "jobs", "oldest", "waited"], {"oldest": "oldest promoted (UTC)",
                                                         "waited": "waited (longest)"})}
<p class="muted">The oldest {len(jobs)} (every one is in never_started.parquet):</p>
{_table(jobs, ["job", "task", "shard", "promoted", "waited"], {"promoted": "promoted (UTC)"})}"""


def _slowest(report: Report) -> str:
    rows = [dict(r, due=_when(r["due_for"]), at=_when(r["ts_ms"])) for r in report.slowest]
    return _table(rows, ["job", "task", "event", "due", "at", "late_ms"],
                  {"due": "due (UTC)", "at": "at (UTC)", "late_ms": "late (ms)"})


def _table(rows: list[dict[str, Any]], columns: list[str],
           labels: dict[str, str] | None = None) -> str:
    labels = labels or {}

    def cell(tag: str, column: str, text: str) -> str:
        return f'<{tag} class="text">{text}</{tag}>' if column in _TEXT else (
            f"<{tag}>{text}</{tag}>")

    head = "".join(cell("th", c, html.escape(labels.get(c) or _label(c))) for c in columns)
    body = "".join("<tr>" + "".join(cell("td", c, _fmt(r.get(c))) for c in columns) + "</tr>"
                   for r in rows)
    return (f'<div class="scroll"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def _label(column: str) -> str:
    return column.replace("_late_", " ").replace("_ms", " (ms)").replace("_", " ")


def _fmt(value: Any) -> str:
    if value is None:
        return "&ndash;"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 1 or value == 0 else f"{value:.3f}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    return html.escape(f"{value:,}" if isinstance(value, int) else str(value))


def _when(ms: int | None) -> str | None:
    at = datetime_of_ms(ms)
    if at is None:
        return None
    return at.strftime("%Y-%m-%d %H:%M:%S.") + f"{at.microsecond // 1000:03d}"


def _duration(ms: int) -> str:
    minutes, seconds = divmod(max(ms, 0) // 1000, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    parts = [(days, "d"), (hours, "h"), (minutes, "min")] if minutes or hours or days else [
        (seconds, "s")]
    return " ".join(f"{n} {unit}" for n, unit in parts if n) or "0 s"
