"""The lateness report: outcomes and lateness per task over time, dead letters, jobs promoted
and never started (nor revoked by a worker), and the backlog, from the exported journal.

Input is what ``celery -A proj delayq export`` writes (Parquet or JSON lines, partitioned by
``date=``, with backlog snapshots in ``_backlog/``), on any Hadoop filesystem (``file://``,
``hdfs://``, ``s3a://``, or a bare path on the default one). Lateness is measured on Redis's
clock, in milliseconds:

* promote lateness = time of the ``promoted`` event - the job's due time;
* start lateness = time of the ``started`` event - the due time it carries (the message's
  ``delayq_due`` header), else that of the job's latest promotion before it.

Percentiles are exact (Spark's ``percentile``, linear interpolation between ranks, as
numpy's default). Buckets are UTC minutes when the events span less than three hours, else
UTC hours, whatever the session or driver time zone.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timezone
from typing import Any

from ..errors import InvalidOption
from ..events import Event
from ..export import BACKLOG, COLUMNS
from . import hadoopfs, page

logger = logging.getLogger(__name__)

PERCENTILES = (0.5, 0.95, 0.99)
OUTCOMES = (Event.SUCCEEDED, Event.FAILED, Event.IGNORED, Event.RETRIED, Event.REVOKED,
            Event.CANCELLED, Event.DEAD)
_COUNTED = (Event.SCHEDULED, Event.RESCHEDULED, Event.PROMOTED, Event.STARTED, *OUTCOMES)
BUCKETS = ("minute", "hour")
MINUTES_BELOW_MS = 3 * 3_600_000  #: events spanning less than this are bucketed by minute
#: A job promoted this long before the export and not started since is listed as never
#: started (a younger one may still wait in its queue).
NOT_STARTED_AFTER_MS = 60_000
#: A job's ``scheduled`` on one shard this near the ``moved`` of its old copy on another is
#: that replace's (the shards' clocks may differ a little).
MOVE_WITHIN_MS = 60_000
LISTED = 50  #: jobs never started listed by name (every one is in never_started.parquet)
_BACKLOG_SCHEMA = ("at_ms BIGINT, shards ARRAY<STRUCT<shard: INT, pending: BIGINT, "
                   "overdue: BIGINT, inflight: BIGINT, dead: BIGINT>>, tasks MAP<STRING, BIGINT>")


@dataclass(frozen=True)
class Backlog:
    """What was stored when the export began, on Redis's clock."""

    at_ms: int
    shards: list[dict[str, int]]  # shard, pending, overdue, inflight, dead
    tasks: dict[str, int]  # task -> jobs pending or in flight

    def total(self, count: str) -> int:
        """``count`` ("pending", "overdue", "inflight" or "dead") over every shard."""
        return sum(shard[count] or 0 for shard in self.shards)


@dataclass(frozen=True)
class Report:
    """Where the page was written, and what it shows."""

    html: str  # the page's path or URI
    source: str
    events: int
    first_ms: int | None
    last_ms: int | None
    export_ms: int  # the later of the last event and the backlog snapshot
    bucket: str  # "minute" or "hour"
    over_time: list[dict[str, Any]]  # one row per task and bucket
    overall: list[dict[str, Any]]  # one row per bucket, every task together
    by_task: list[dict[str, Any]]  # one row per task, every bucket together
    slowest: list[dict[str, Any]]
    dead: list[dict[str, Any]]  # one row per task and reason
    never_started: list[dict[str, Any]]  # the oldest LISTED jobs
    never_started_by_task: list[dict[str, Any]]
    workers_journal: bool  # started events seen: never started can be told
    backlog: Backlog | None


def read_events(spark, events: str | os.PathLike):
    """The exported events under ``events`` as a DataFrame, each entry once. Entries
    without an id or a time (a line cut short) are dropped, and their number logged."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    root = hadoopfs.uri(events)
    if not hadoopfs.exists(spark, root):
        raise FileNotFoundError(f"no exported events at {root}; run "
                                "`celery -A proj delayq export --to DIR` first")
    suffixes = hadoopfs.data_suffixes(spark, root, (".parquet", ".jsonl"))
    if len(suffixes) > 1:
        raise InvalidOption(f"{root} holds both .parquet and .jsonl event files, which "
                            "are read differently; export each format to its own folder "
                            "(--to) and report on one")
    if suffixes == {".parquet"}:
        df = spark.read.parquet(root)
    elif suffixes == {".jsonl"}:
        text, num = T.StringType(), T.LongType()
        schema = T.StructType([T.StructField(name, num if name in (
            "shard", "ts_ms", "due_ms", "retries") else text) for name in COLUMNS])
        df = spark.read.schema(schema).option("pathGlobFilter", "*.jsonl").json(root)
    else:
        raise FileNotFoundError(f"{root} holds no .parquet or .jsonl event files")
    broken = F.col("id").isNull() | F.col("ts_ms").isNull()
    dropped = df.select(F.count(F.when(broken, 1))).first()[0]  # (a pushed-down filter
    # would parse a cut line otherwise and miss it)
    if dropped:
        logger.warning("dropped %d events without an id or time under %s (a line cut "
                       "short, or not an export's)", dropped, root)
    return df.where(~broken).select(*COLUMNS).dropDuplicates(["shard", "id"])


def read_backlog(spark, events: str | os.PathLike) -> Backlog | None:
    """The latest backlog snapshot beside the events; None when the export wrote none."""
    from pyspark.sql import functions as F

    folder = f"{hadoopfs.uri(events)}/{BACKLOG}"
    if not hadoopfs.exists(spark, folder):
        return None
    row = (spark.read.schema(_BACKLOG_SCHEMA).option("multiLine", "true")
           .option("pathGlobFilter", "backlog-*.json").json(folder)
           .where(F.col("at_ms").isNotNull()).orderBy(F.col("at_ms").desc()).first())
    if row is None:
        return None
    return Backlog(row.at_ms, [s.asDict() for s in row.shards or []], dict(row.tasks or {}))


def lateness(events):
    """Events with ``late_ms`` for promoted/started events, ``due_for`` (the due time they
    answer), and the job's task on events that lack it (a dead letter of a call)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    job = Window.partitionBy("shard", "job")
    ordered = job.orderBy("ts_ms", _seq()).rowsBetween(Window.unboundedPreceding,
                                                      Window.currentRow)
    promoted_due = F.when(F.col("event") == Event.PROMOTED, F.col("due_ms"))
    df = (events
          .withColumn("_promoted_due", F.last(promoted_due, ignorenulls=True).over(ordered))
          .withColumn("late_ms", F.when(F.col("event") == Event.PROMOTED,
                                        F.col("ts_ms") - F.col("due_ms"))
                      .when(F.col("event") == Event.STARTED,
                            F.col("ts_ms") - F.coalesce("due_ms", "_promoted_due")))
          .withColumn("task", F.coalesce("task", F.when(
              F.col("job").isNotNull(), F.first("task", ignorenulls=True).over(job)))))
    return df.withColumn("due_for", F.coalesce("due_ms", "_promoted_due")).drop("_promoted_due")


def as_counted(events):
    """Events with ``counted``, the event as the counts take it: a job moved to another
    shard by a replace is rescheduled (its ``scheduled`` or ``rescheduled`` there nearest
    to the ``moved`` on the old shard, within :data:`MOVE_WITHIN_MS`), and a dead letter
    dropped (``cancelled`` from ``dead``) is no cancel of a pending job (null: not
    counted)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    moves = events.where(F.col("event") == Event.MOVED).select(
        "job", F.col("shard").alias("_from"), F.col("id").alias("_move"),
        F.col("ts_ms").alias("_moved_ms"))
    apart = F.abs(F.col("ts_ms") - F.col("_moved_ms"))
    nearest = Window.partitionBy("_from", "_move").orderBy(apart, "ts_ms")
    arrivals = (events.where(F.col("event").isin(Event.SCHEDULED, Event.RESCHEDULED))
                .select("shard", "id", "job", "ts_ms").join(moves, "job")
                .where((F.col("shard") != F.col("_from")) & (apart <= MOVE_WITHIN_MS))
                .withColumn("_rank", F.row_number().over(nearest)).where(F.col("_rank") == 1)
                .select("shard", "id", F.lit(True).alias("_moved_in")).distinct())
    dropped = (F.col("event") == Event.CANCELLED) & F.get_json_object(
        "extra", "$.from").eqNullSafe("dead")
    return (events.join(arrivals, ["shard", "id"], "left")
            .withColumn("counted", F.when(F.col("_moved_in"), F.lit(Event.RESCHEDULED.value))
                        .when(~dropped, F.col("event")))
            .drop("_moved_in"))


def choose_bucket(first_ms: int | None, last_ms: int | None) -> str:
    """"minute" for events spanning less than :data:`MINUTES_BELOW_MS`, else "hour"."""
    short = first_ms is not None and last_ms is not None and (
        last_ms - first_ms < MINUTES_BELOW_MS)
    return "minute" if short else "hour"


def _stats(df, keys: list[str]):
    from pyspark.sql import functions as F

    counts = [F.sum(F.when(F.col("counted") == e, 1).otherwise(0)).alias(e.value)
              for e in _COUNTED]
    late = []
    for kind in (Event.PROMOTED, Event.STARTED):
        value = F.when(F.col("event") == kind, F.col("late_ms").cast("double"))
        prefix = "promote" if kind == Event.PROMOTED else "start"
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


def dead_letters(df):
    """Dead letters per task and reason: how many, how many were replayed since (a
    ``replayed`` after it in its shard's journal), the last."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    since = Window.partitionBy("shard", "job").orderBy("ts_ms", _seq()).rowsBetween(
        1, Window.unboundedFollowing)
    dead = (df.where(F.col("event").isin(Event.DEAD, Event.REPLAYED))
            .withColumn("_replayed", F.bool_or(F.col("event") == Event.REPLAYED).over(since))
            .where(F.col("event") == Event.DEAD))
    return (dead.groupBy("task", "reason")
            .agg(F.count("*").alias("dead"),
                 F.sum(F.when(F.col("_replayed"), 1).otherwise(0)).alias("replayed"),
                 F.max("ts_ms").alias("last_ms"))
            .orderBy(F.col("dead").desc(), "task", "reason"))


def never_started(df, before_ms: int):
    """Jobs whose latest promotion, at ``before_ms`` or earlier, no start answered: none
    for its due time or a later one (a start's ``due``, else its time). A fast worker's
    start may be journaled before the carrier's promotion. A worker's ``revoked`` (the run
    discarded before it started: revoked in the broker, expired) answers it too."""
    from pyspark.sql import functions as F

    cycle = F.coalesce("due_ms", "ts_ms")  # the due time an event answers
    promoted = F.when(F.col("event") == Event.PROMOTED, F.struct("ts_ms", cycle.alias("due")))
    jobs = (df.where(F.col("job").isNotNull()).groupBy("shard", "job")
            .agg(F.first("task", ignorenulls=True).alias("task"),
                 F.max(promoted).alias("_promoted"),
                 F.max(F.when(F.col("event").isin(Event.STARTED, Event.REVOKED), cycle))
                 .alias("_started")))
    return (jobs.withColumn("promoted_ms", F.col("_promoted.ts_ms"))
            .where(F.col("promoted_ms") <= before_ms)
            .where(F.col("_started").isNull() | (F.col("_started") < F.col("_promoted.due")))
            .drop("_promoted", "_started").orderBy("promoted_ms", "job"))


def build_report(spark, events: str | os.PathLike, out: str | os.PathLike, *,
                 slowest: int = 20, bucket: str = "auto") -> Report:
    """Compute the report from exported events; write its Parquet tables and
    ``report.html`` under ``out`` (any Hadoop filesystem path)."""
    from pyspark.sql import functions as F

    if bucket not in ("auto", *BUCKETS):
        raise InvalidOption(f"bucket must be auto, minute or hour; got {bucket!r}")
    source, out = hadoopfs.uri(events), hadoopfs.uri(out)
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")  # buckets are UTC minutes / hours
    df = as_counted(lateness(read_events(spark, source))).cache()
    cached = [df]
    try:
        backlog = read_backlog(spark, source)
        span = df.agg(F.min("ts_ms"), F.max("ts_ms"), F.count("*"),
                      F.count(F.when(F.col("event") == Event.STARTED, 1))).first()
        first_ms, last_ms, count, started = span
        unit = choose_bucket(first_ms, last_ms) if bucket == "auto" else bucket
        timed = df.withColumn("bucket", F.date_trunc(unit, F.timestamp_millis("ts_ms")))
        tasks = timed.where(F.col("task").isNotNull())
        export_ms = max(last_ms or 0, backlog.at_ms if backlog else 0)
        lost = never_started(df, export_ms - NOT_STARTED_AFTER_MS)
        if not started:  # workers journal no started events: nothing can be told
            lost = lost.limit(0)
        tables = {
            "over_time": _stats(tasks, ["task", "bucket"]).orderBy("task", "bucket"),
            "by_task": _stats(tasks, ["task"]).orderBy("task"),
            "slowest": (df.where(F.col("event").isin(Event.STARTED, Event.PROMOTED))
                        .where(F.col("late_ms").isNotNull())
                        .orderBy(F.col("late_ms").desc(), "id").limit(slowest)
                        .select("job", "task", "event", "shard", "id", "due_for", "ts_ms",
                                "late_ms")),
            "dead": dead_letters(df),
            "never_started": lost,
        }
        for name, table in tables.items():
            cached.append(table.cache())  # written, then collected
            table.write.mode("overwrite").parquet(f"{out}/{name}.parquet")
        report = Report(
            html=f"{out}/report.html", source=source, events=count, first_ms=first_ms,
            last_ms=last_ms, export_ms=export_ms, bucket=unit,
            over_time=_utc(tables["over_time"].collect()),
            overall=_utc(_stats(timed, ["bucket"]).orderBy("bucket").collect()),
            by_task=_dicts(tables["by_task"]), slowest=_dicts(tables["slowest"]),
            dead=_dicts(tables["dead"]), never_started=_dicts(lost.limit(LISTED)),
            never_started_by_task=_dicts(
                lost.groupBy("task").agg(F.count("*").alias("jobs"),
                                         F.min("promoted_ms").alias("oldest_ms"))
                .orderBy(F.col("jobs").desc(), "task")),
            workers_journal=bool(started), backlog=backlog)
    finally:
        for frame in cached:
            frame.unpersist()
        spark.conf.set("spark.sql.session.timeZone", zone)
    hadoopfs.write_text(spark, report.html, page.render(report))
    return report


def _seq():
    """An entry's sequence number within its millisecond (the id's ``<seq>``)."""
    from pyspark.sql import functions as F

    return F.split("id", "-").getItem(1).cast("long")


def _dicts(df) -> list[dict[str, Any]]:
    return [row.asDict() for row in df.collect()]


def _utc(rows) -> list[dict[str, Any]]:
    """Rows as dicts, their ``bucket`` an aware UTC datetime: PySpark hands timestamps to
    the driver as naive local times of its own time zone (a null bucket stays None)."""
    return [{**row.asDict(), "bucket": row["bucket"] and row["bucket"].astimezone(timezone.utc)}
            for row in rows]
