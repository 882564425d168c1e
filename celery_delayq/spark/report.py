"""The lateness report: per task and hour, outcomes and lateness from the exported journal.

Input is what ``celery -A proj delayq export`` writes (Parquet or JSON lines, partitioned by
``date=``). Lateness is measured on Redis's clock, in milliseconds:

* promote lateness = time of the ``promoted`` event - the job's due time;
* start lateness = time of the ``started`` event - the due time of the job's latest
  promotion before it (the worker's event does not carry the due time itself).

Percentiles are exact (Spark's ``percentile``, linear interpolation between ranks, as
numpy's default). Hours are UTC hours of the event time, whatever the session or driver time
zone.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..export import COLUMNS
from . import charts

PERCENTILES = (0.5, 0.95, 0.99)
OUTCOMES = ("succeeded", "failed", "retried", "cancelled", "dead")
_COUNTED = ("scheduled", "rescheduled", "promoted", "started", *OUTCOMES)


@dataclass(frozen=True)
class Report:
    """Where the report was written and its headline numbers."""

    html: Path
    hourly: list[dict[str, Any]]  # one row per task and hour
    by_task: list[dict[str, Any]]  # one row per task, every hour together
    slowest: list[dict[str, Any]]


def read_events(spark, events: str | Path):
    """The exported events under ``events`` as a DataFrame, each entry once."""
    from pyspark.sql import types as T

    root = Path(events)
    if not root.exists():
        raise FileNotFoundError(f"no exported events at {root}; run "
                                "`celery -A proj delayq export --to DIR` first")
    if any(root.rglob("*.parquet")):
        df = spark.read.parquet(str(root))
    elif any(root.rglob("*.jsonl")):
        text, num = T.StringType(), T.LongType()
        schema = T.StructType([T.StructField(name, num if name in (
            "shard", "ts_ms", "due_ms", "retries") else text) for name in COLUMNS])
        df = spark.read.schema(schema).option("pathGlobFilter", "*.jsonl").json(str(root))
    else:
        raise FileNotFoundError(f"{root} holds no .parquet or .jsonl event files")
    return df.select(*COLUMNS).dropDuplicates(["shard", "id"])


def lateness(events):
    """Events with ``hour`` and, for promoted/started events, ``late_ms``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    seq = F.split("id", "-").getItem(1).cast("long")
    ordered = (Window.partitionBy("shard", "job").orderBy("ts_ms", "_seq")
               .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    promoted_due = F.when(F.col("event") == "promoted", F.col("due_ms"))
    df = (events.withColumn("_seq", seq)
          .withColumn("_promoted_due", F.last(promoted_due, ignorenulls=True).over(ordered))
          .withColumn("late_ms", F.when(F.col("event") == "promoted",
                                        F.col("ts_ms") - F.col("due_ms"))
                      .when(F.col("event") == "started",
                            F.col("ts_ms") - F.coalesce("due_ms", "_promoted_due")))
          .withColumn("hour", F.date_trunc("hour", F.timestamp_millis("ts_ms")))
          .drop("_seq"))
    return df.withColumn("due_for", F.coalesce("due_ms", "_promoted_due")).drop("_promoted_due")


def _stats(df, keys: list[str]):
    from pyspark.sql import functions as F

    counts = [F.sum(F.when(F.col("event") == e, 1).otherwise(0)).alias(e) for e in _COUNTED]
    late = []
    for kind in ("promoted", "started"):
        value = F.when(F.col("event") == kind, F.col("late_ms").cast("double"))
        prefix = "promote" if kind == "promoted" else "start"
        qs = F.percentile(value, F.array(*[F.lit(p) for p in PERCENTILES]))
        late.append(qs.alias(f"_{prefix}_q"))
        late.append(F.max(value).alias(f"{prefix}_late_max_ms"))
    out = df.groupBy(*keys).agg(*counts, *late)
    for prefix in ("promote", "start"):
        for i, p in enumerate(PERCENTILES):
            out = out.withColumn(f"{prefix}_late_p{round(p * 100)}_ms",
                                 F.col(f"_{prefix}_q").getItem(i))
        out = out.drop(f"_{prefix}_q")
    return out.withColumn("cancel_rate", F.when(F.col("scheduled") > 0,
                                                F.col("cancelled") / F.col("scheduled")))


def build_report(spark, events: str | Path, out: str | Path, *, slowest: int = 20) -> Report:
    """Compute the report from exported events; write Parquet tables and ``report.html``."""
    from pyspark.sql import functions as F

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")  # hours are UTC hours
    df = lateness(read_events(spark, events)).cache()
    try:
        hourly_df = _stats(df.where(F.col("task").isNotNull()), ["task", "hour"])
        by_task_df = _stats(df.where(F.col("task").isNotNull()), ["task"])
        overall_df = _stats(df, ["hour"])
        slow_df = (df.where((F.col("event") == "started") | (F.col("event") == "promoted"))
                   .where(F.col("late_ms").isNotNull())
                   .orderBy(F.col("late_ms").desc(), "id")
                   .limit(slowest)
                   .select("job", "task", "event", "shard", "id", "due_for", "ts_ms",
                           "late_ms"))
        hourly_df.orderBy("task", "hour").write.mode("overwrite").parquet(
            str(out / "hourly.parquet"))
        by_task_df.orderBy("task").write.mode("overwrite").parquet(str(out / "by_task.parquet"))
        slow_df.write.mode("overwrite").parquet(str(out / "slowest.parquet"))
        hourly = _utc(hourly_df.orderBy("task", "hour").collect())
        by_task = [r.asDict() for r in by_task_df.orderBy("task").collect()]
        overall = _utc(overall_df.orderBy("hour").collect())
        slow = [r.asDict() for r in slow_df.collect()]
        events_count = df.count()
    finally:
        df.unpersist()
        spark.conf.set("spark.sql.session.timeZone", zone)
    page = out / "report.html"
    page.write_text(_html(hourly, by_task, overall, slow, events_count, str(events)),
                    encoding="utf-8")
    return Report(page, hourly, by_task, slow)


# -- HTML ------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2rem auto;max-width:1100px;color:#222}
h1{font-size:1.5rem}h2{font-size:1.15rem;margin-top:2rem}
table{border-collapse:collapse;font-size:12px}td,th{padding:3px 8px;border-bottom:1px solid #ddd;
text-align:right}th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.muted{color:#777}svg{max-width:100%;height:auto}
"""


def _fmt(value: Any) -> str:
    if value is None:
        return "&ndash;"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 1 or value == 0 else f"{value:.3f}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:00")
    return html.escape(f"{value:,}" if isinstance(value, int) else str(value))


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(r.get(c))}</td>" for c in columns) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _utc(rows) -> list[dict[str, Any]]:
    """Rows as dicts, their ``hour`` an aware UTC datetime: PySpark hands timestamps to
    the driver as naive local times of its own time zone."""
    return [{**row.asDict(), "hour": row["hour"].astimezone(timezone.utc)} for row in rows]


def _when(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds")


def _html(hourly, by_task, overall, slow, events_count: int, source: str) -> str:
    hours = [r["hour"].strftime("%m-%d %H:00") for r in overall]
    late_chart = charts.lines(
        "Promote lateness per hour (ms)", hours,
        {f"p{round(p * 100)}": [r[f"promote_late_p{round(p * 100)}_ms"] for r in overall]
         for p in PERCENTILES})
    start_chart = charts.lines(
        "Start lateness per hour (ms)", hours,
        {f"p{round(p * 100)}": [r[f"start_late_p{round(p * 100)}_ms"] for r in overall]
         for p in PERCENTILES})
    mix_chart = charts.stacked_bars(
        "Outcome mix per task", [r["task"] for r in by_task],
        {o: [r[o] for r in by_task] for o in OUTCOMES})
    late_cols = [f"{k}_late_{q}_ms" for k in ("promote", "start")
                 for q in ("p50", "p95", "p99", "max")]
    counts = ["scheduled", "promoted", "cancelled", "succeeded", "failed", "cancel_rate"]
    slow_rows = [dict(r, due=_when(r["due_for"]), at=_when(r["ts_ms"])) for r in slow]
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>celery-delayq lateness report</title><style>{_CSS}</style></head><body>
<h1>celery-delayq lateness report</h1>
<p class="muted">{events_count:,} journal events from {html.escape(source)}; generated
{datetime.now(timezone.utc).isoformat(timespec="seconds")}. Lateness is event time &minus; due time
on Redis's clock, in ms; percentiles are exact.</p>
<h2>Lateness over time</h2>{late_chart}{start_chart}
<h2>Outcomes</h2>{mix_chart}
<h2>Per task</h2>{_table(by_task, ["task", *counts, *late_cols])}
<h2>Per task and hour</h2>{_table(hourly, ["task", "hour", *counts, *late_cols])}
<h2>Slowest jobs</h2>{_table(slow_rows, ["job", "task", "event", "due", "at", "late_ms"])}
</body></html>
"""
