"""``schedule_dataframe``: one delayed Celery task per DataFrame row, idempotent by job id.

Each partition opens one store connection and writes its rows through the schedule
script in pipelined batches (:mod:`.partition`); only the columns a call uses travel to
Python, by Arrow. Rows that cannot be scheduled come back in a rejects DataFrame (the
input columns plus ``reason``); none is dropped silently. Executors build envelopes
from a shipped copy of the app's routing config (:mod:`.shipping`), so they need this
package installed, not the project's task code.

Each row is written at most once per call, however often Spark runs its task: the rows
are named by partition and position, and the store keeps what the call did with each
(``RunRows``), so a retried task answers the first outcome and writes nothing. Summary
and rejects come from the one collect of the write; the rejects' other columns are
looked up in the input then, by a read that writes nothing, so reading the rejects later
computes nothing again.

Duplicate ids in the input are found first (a count per id); of each, the row whose used
columns sort first as JSON text is written, the others are rejects that never reach Redis.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from .. import validation
from ..errors import DelayQError, InvalidOption, UnknownQueue
from ..keys import Keyspace
from ..store import Store
from . import shipping
from .partition import COUNTS, LOST, REASON, Plan, queue_template, write_partition

if TYPE_CHECKING:
    from celery import Celery
    from pyspark.accumulators import AccumulatorParam
    from pyspark.sql import Column, DataFrame

    from ..conf import DelayQConfig

logger = logging.getLogger(__name__)

#: Hidden columns of the driver's plans: a row's used columns as JSON text (how rows are
#: told apart), a duplicated id (or a reject's text), a count (or a reject's number among
#: its equals), a hash of the id.
_MATCH, _WINNER, _NTH, _HASH = "__delayq_match", "__delayq_winner", "__delayq_nth", "__delayq_hash"
#: The thread-local properties ``setJobGroup`` sets.
_LABELS = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
#: JSON text of timestamps to the microsecond (Spark's default stops at the millisecond).
_JSON = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
         "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"}

Progress = Callable[["PartitionProgress"], None]


@dataclass(frozen=True)
class Summary:
    """What a ``schedule_dataframe`` run did with its rows."""

    scheduled: int  # newly stored (or replaced, with if_exists="replace")
    existed: int  # already stored under the same job id and left as they were
    rejected: int  # refused; see the rejects DataFrame for why
    past: int = 0  # of all those, rows whose eta had passed (run at once, or rejected)

    @property
    def total(self) -> int:
        return self.scheduled + self.existed + self.rejected


@dataclass(frozen=True)
class PartitionProgress:
    """Driver-side progress of a running ``schedule_dataframe`` job."""

    partitions_done: int
    partitions: int
    rows_done: int
    elapsed: float

def schedule_dataframe(df: DataFrame, app: Celery, *, task: str, id_col: str,
                       delay_col: str | None = None, eta_col: str | None = None,
                       args_cols: Iterable[str] = (), kwargs_col: str | None = None,
                       key_col: str | None = None, queue: str | None = None,
                       queue_col: str | None = None, options: dict[str, Any] | None = None,
                       if_exists: str = "keep", batch_size: int = 5000, past: str = "run",
                       progress: Progress | None = None,
                       run: str | None = None) -> tuple[Summary, DataFrame]:
    """Schedule one call of ``task`` per row of ``df``; return ``(summary, rejects)``.

    ``id_col`` is the job id (makes the write idempotent); the due time comes from
    ``delay_col`` (seconds) or ``eta_col`` (timestamp, ISO string with offset, or epoch
    seconds). Positional arguments are ``args_cols`` in order, keyword arguments the
    struct/map column ``kwargs_col``. ``queue`` / ``queue_col`` pick the queue per call or
    per row; ``options`` are further ``apply_async`` options for every call. An eta that
    has passed (on the executor's clock) runs at once with ``past="run"``, as
    ``apply_delayed`` does, or is rejected with ``past="reject"``; ``Summary.past`` counts
    them. ``progress`` is called on the driver as partitions finish.

    ``run`` names the call's rows in the store (default: a fresh name, forgotten when
    the call ends). A call given the name of an earlier one, with the same input, answers
    that call's outcome row by row and writes nothing again; a named run's outcome stays
    until ``Store.forget_run`` (or 24 h after its last write): ``schedule_stream`` names
    each micro-batch, so a replayed batch counts what it wrote as scheduled.
    """
    from pyspark.sql import types as T

    plan = _plan(df, app, task, id_col, delay_col, eta_col, args_cols, kwargs_col, key_col,
                 queue, queue_col, options, if_exists, batch_size, past)
    if run is not None:
        plan = replace(plan, run=run)
    spark = df.sparkSession
    sc = spark.sparkContext
    group = f"delayq-schedule-{plan.run}"  # the write's jobs: the watcher counts them
    labels = {name: sc.getLocalProperty(name) for name in _LABELS}  # the caller's, restored
    try:
        reads = f"delayq-read-{plan.run}"  # the reads before and after it
        sc.setJobGroup(reads, f"celery-delayq: find duplicate ids for {task}")
        source, partitions = _source(df, plan)
        sc.setJobGroup(group, f"celery-delayq: schedule {task} from a DataFrame")
        done_rows = sc.accumulator(  # (partitions, rows) written
            (0, 0), cast("AccumulatorParam[tuple[int, int]]", _Tally()))
        written = T.StructType([
            *(T.StructField(field, df.schema[name].dataType, True)
              for name, field in plan.fields.items()),
            T.StructField(REASON, T.StringType(), True),
            T.StructField(COUNTS, T.ArrayType(T.LongType()), True)])
        with warnings.catch_warnings():  # PySpark 3.5 checks pandas with distutils'
            warnings.filterwarnings(      # deprecated LooseVersion
                "ignore", "distutils Version classes are deprecated", DeprecationWarning)
            outcomes = source.mapInArrow(
                lambda batches: write_partition(plan, batches, done_rows), written)
        watcher = _Watcher(partitions, done_rows, progress)
        watcher.start()
        try:  # the one job that writes: nothing computes it again
            collected = outcomes.select(REASON, COUNTS,
                                        _content(plan.used, plan.fields.values())).collect()
        finally:
            watcher.stop()
            if run is None:  # a fresh name: no later call answers from it, failed or not
                forget_run(shipping.config(plan.shipped), plan.run)
        counts = [row[1] for row in collected if row[0] is None]
        sc.setJobGroup(reads, f"celery-delayq: look up the rejected rows of {task}")
        rejects = _rejects(df, plan, [(row[2], row[0]) for row in collected
                                      if row[0] is not None])
    finally:
        for name, value in labels.items():  # None removes it (pyspark's hint says str)
            sc.setLocalProperty(name, value)  # type: ignore[arg-type]
    scheduled, existed, rejected, late = (sum(c[n] for c in counts) for n in range(4))
    return Summary(scheduled, existed, rejected, late), rejects


def named_column(name: str) -> Column:
    """The column of that name as it is: quoted, a dot in it is no struct's field and a
    backtick no quote."""
    from pyspark.sql import functions as F

    quoted = name.replace("`", "``")
    return F.col(f"`{quoted}`")


def _content(names: Iterable[str], columns: Iterable[str] | None = None) -> Column:
    """A row's columns ``names`` (or ``columns``, under those names) as JSON text: equal
    rows, equal text; ordered."""
    from pyspark.sql import functions as F

    names = tuple(names)
    return F.to_json(F.struct(*(named_column(column).alias(name) for name, column
                                in zip(names, columns or names, strict=True))),
                     _JSON).alias(_MATCH)


def _source(df: DataFrame, plan: Plan) -> tuple[DataFrame, int]:
    """The used columns of ``df`` and their partitions' count; when some id has several
    rows, the ``LOST`` flag on every row of it but the one whose content sorts first. A
    count per hash of the id finds them (longs count faster than text); the rows of those
    hashes are ranked in the read that writes them, so exactly one row of an id wins even
    when a column is computed anew on every read; they go to as many partitions again,
    the other rows keep theirs."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    used = [named_column(name).alias(field) for name, field in plan.fields.items()]
    ident = named_column(plan.id_col)
    shared = (df.where(ident.isNotNull()).groupBy(F.xxhash64(ident).alias(_HASH)).count()
              .where("count > 1").select(_HASH).collect())
    partitions = df.rdd.getNumPartitions()
    if not shared:
        return df.select(*used), partitions
    hashes = df.sparkSession.createDataFrame(shared, f"{_HASH} long")
    marked = df.join(F.broadcast(hashes), F.xxhash64(ident) == F.col(_HASH), "left")
    single = marked.where(F.col(_HASH).isNull()).select(*used, F.lit(False).alias(LOST))
    rank = F.row_number().over(Window.partitionBy(ident).orderBy(_MATCH))
    ranked = (marked.where(F.col(_HASH).isNotNull())
              .repartition(partitions, ident)  # as many writers again (not coalesced)
              .withColumn(_MATCH, _content(plan.used))
              .select(*used, (ident.isNotNull() & (rank > 1)).alias(LOST)))
    return single.unionByName(ranked), 2 * partitions


def _rejects(df: DataFrame, plan: Plan, found: list[tuple[str, str]]) -> DataFrame:
    """The input rows of the rejects (used columns as JSON text, reason), with their
    reasons: n rejects of one text are n input rows of that text (equal in every used
    column, so any n of them). A reject the input no longer holds (a column computed
    anew on every read) comes back from its used columns, the others null. When the
    rows cannot be brought to the driver, the lookup stays in Spark (a local checkpoint)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    spark = df.sparkSession
    schema = T.StructType([*(T.StructField(field.name, field.dataType) for field in df.schema),
                           T.StructField("reason", T.StringType())])
    if not found:
        return spark.createDataFrame([], schema)
    reasons = (spark.createDataFrame(found, f"{_WINNER} string, {REASON} string")
               .groupBy(_WINNER).agg(F.collect_list(REASON).alias(REASON)))
    nth = F.row_number().over(Window.partitionBy(_MATCH).orderBy(_MATCH))
    lookup = (df.withColumn(_MATCH, _content(plan.used))
              .join(F.broadcast(reasons), F.col(_MATCH) == F.col(_WINNER))
              .withColumn(_NTH, nth).where(F.col(_NTH) <= F.size(REASON))
              .select(*(named_column(name) for name in df.columns),
                      F.element_at(REASON, F.col(_NTH)).alias("reason"), _MATCH))
    try:
        return _on_driver(df, plan, found, lookup, schema)
    except Exception as exc:  # the write is done: its summary must come back
        logger.warning("the rejected rows cannot be brought to the driver (%s); the rejects "
                       "stay in Spark (a local checkpoint) instead", exc)
        return lookup.drop(_MATCH).localCheckpoint()


def _on_driver(df: DataFrame, plan: Plan, found: list[tuple[str, str]], lookup: DataFrame,
               schema) -> DataFrame:
    """The rejects of ``lookup`` (input columns, reason, used columns as JSON text),
    collected, and those of ``found`` it misses from their text."""
    rows = lookup.collect()
    rejects = df.sparkSession.createDataFrame([row[:-1] for row in rows], schema)
    missing = _unmatched(found, [row[-1] for row in rows])
    if not missing:
        return rejects
    logger.warning(
        "%d of the %d rejected rows were not found in the input again: it is not "
        "deterministic (a column computed anew on every read, such as a UDF with random(), "
        "or an input that changed). They come back with their used columns as the write "
        "saw them and the other columns null; cache the input to keep them whole",
        len(missing), len(found))
    return rejects.unionByName(_from_text(df, plan, missing, schema))


def _unmatched(found: list[tuple[str, str]], matched: list[str]) -> list[tuple[str, str]]:
    """The rejects (text, reason) of ``found`` left when each text of ``matched`` has taken
    one of its own, in order."""
    taken = Counter(matched)
    missing = []
    for text, reason in found:
        if taken[text]:
            taken[text] -= 1
        else:
            missing.append((text, reason))
    return missing


def _from_text(df: DataFrame, plan: Plan, rejects: list[tuple[str, str]],
               schema) -> DataFrame:
    """Rows of ``schema`` from rejects (used columns as JSON text, reason): the used
    columns JSON can hold parsed back, the others null."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    spark = df.sparkSession
    used = T.StructType([field for field in (df.schema[name] for name in plan.used)
                         if _parsable(spark, field)])
    parsed = F.from_json(_WINNER, used, _JSON)
    columns = [(parsed.getField(field.name) if field.name in used.names
                else F.lit(None)).cast(field.dataType).alias(field.name)
               for field in df.schema.fields]
    rows = (spark.createDataFrame(rejects, f"{_WINNER} string, reason string")
            .select(*columns, "reason").collect())
    return spark.createDataFrame(rows, schema)


def _parsable(spark, field) -> bool:
    """Whether ``from_json`` can read a column of ``field``'s type (not a map whose keys
    are not strings)."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    try:
        spark.range(0).select(F.from_json(F.lit("{}"), T.StructType([field])))
    except AnalysisException:
        return False
    return True


def forget_run(config: DelayQConfig, run: str) -> None:
    """Drop a finished call's outcome from the store (``Store.forget_run``). It is clean-up
    after the write: a refusal is logged, and the outcome expires by itself."""
    store = Store(config)
    try:
        store.forget_run(run)
    except DelayQError as exc:
        logger.warning("could not drop the outcome of run %s (%s); it expires by itself "
                       "within 24 h", run, exc)
    finally:
        store.close()


def _plan(df, app, task, id_col, delay_col, eta_col, args_cols, kwargs_col, key_col, queue,
          queue_col, options, if_exists, batch_size, past) -> Plan:
    """Check the arguments against the DataFrame on the driver, before any write."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import types as T

    validation.if_exists(if_exists)
    if not isinstance(task, str) or not task:
        raise InvalidOption("task must be the registered task name, e.g. 'shop.tasks.refund'")
    if (delay_col is None) == (eta_col is None):
        raise InvalidOption("pass exactly one of delay_col= (seconds) or eta_col= (timestamp)")
    if queue is not None and queue_col is not None:
        raise InvalidOption("pass queue= (every row) or queue_col= (per row), not both")
    if batch_size < 1:
        raise InvalidOption("batch_size must be at least 1")
    if past not in ("run", "reject"):
        raise InvalidOption(f"past={past!r}: pass 'run' (an eta that has passed runs at "
                            "once, as apply_delayed does) or 'reject'")
    args_cols = tuple(args_cols)
    types = dict(df.dtypes)
    for role, name in [("id_col", id_col), ("delay_col", delay_col), ("eta_col", eta_col),
                       ("kwargs_col", kwargs_col), ("key_col", key_col),
                       ("queue_col", queue_col), *(("args_cols", c) for c in args_cols)]:
        if name is not None and name not in types:
            raise InvalidOption(f"{role}={name!r} is not a column of the DataFrame; its "
                                f"columns are {', '.join(df.columns)}")
    hidden = [name for name in types if name.startswith("__delayq_")]
    if hidden:
        raise InvalidOption(f"the DataFrame may not have columns named __delayq_*: {hidden}")
    eta_kind = None if eta_col is None else _eta_kind(df, eta_col)
    if delay_col is not None and not isinstance(df.schema[delay_col].dataType, T.NumericType):
        raise InvalidOption(
            f"delay_col {delay_col!r} is {df.schema[delay_col].dataType.simpleString()}; "
            f"use a number of seconds, e.g. F.col({delay_col!r}).cast('double') for text")
    if kwargs_col is not None and not isinstance(df.schema[kwargs_col].dataType,
                                                 (T.StructType, T.MapType)):
        raise InvalidOption(f"kwargs_col {kwargs_col!r} must be a struct or map column")
    _refuse_binary(df, (*args_cols, *([kwargs_col] if kwargs_col else [])))
    options = dict(options or {})
    for name in ("queue", "task_id", "countdown", "eta"):
        if name in options:
            raise InvalidOption(f"options may not set {name!r}; use the matching argument")
    options = {**_declared_options(app, task), **options}
    _check_arguments(app, task, args_cols,
                     None if kwargs_col is None else df.schema[kwargs_col].dataType)
    plan = Plan(
        shipped=shipping.ship(app, task), task=task, id_col=id_col, delay_col=delay_col,
        eta_kind=eta_kind, eta_col=eta_col, args_cols=args_cols, kwargs_col=kwargs_col,
        key_col=key_col, queue=queue, queue_col=queue_col, options=options,
        if_exists=if_exists, batch_size=batch_size, past=past, run=uuid.uuid4().hex)
    _check_calls(plan)
    try:
        df.select(_content(plan.used))  # rows are told apart by it: it must exist
    except AnalysisException as exc:
        raise InvalidOption(f"the columns {', '.join(plan.used)} cannot be written as JSON "
                            f"text ({exc}); cast the column to a string or struct") from None
    return plan


def _eta_kind(df: DataFrame, eta_col: str) -> str:
    """How ``eta_col`` holds its instants: "us" (a timestamp), "str" or "num" (epoch s)."""
    from pyspark.sql import types as T

    eta_type = df.schema[eta_col].dataType
    if isinstance(eta_type, (T.TimestampType, T.TimestampNTZType)):
        return "us"
    if isinstance(eta_type, T.StringType):
        return "str"
    if isinstance(eta_type, T.NumericType):
        return "num"
    raise InvalidOption(f"eta_col {eta_col!r} is {eta_type.simpleString()}; use a "
                        "timestamp, an ISO-8601 string with offset, or epoch seconds")


def _refuse_binary(df: DataFrame, columns: Iterable[str]) -> None:
    """Refuse argument columns that are, or hold, bytes: JSON has no bytes."""
    for name in columns:
        kind = df.schema[name].dataType
        if _holds_binary(kind):
            raise InvalidOption(
                f"argument column {name!r} is {kind.simpleString()}: binary data cannot be "
                "a task argument (calls are JSON); encode it first, e.g. F.base64(...)")


def _holds_binary(kind) -> bool:
    """True when a Spark type is binary or a struct, array or map holding binary."""
    from pyspark.sql import types as T

    if isinstance(kind, T.BinaryType):
        return True
    if isinstance(kind, T.StructType):
        return any(_holds_binary(field.dataType) for field in kind.fields)
    if isinstance(kind, T.ArrayType):
        return _holds_binary(kind.elementType)
    if isinstance(kind, T.MapType):
        return _holds_binary(kind.keyType) or _holds_binary(kind.valueType)
    return False


def _check_calls(plan: Plan) -> None:
    """Build the call template on the driver as executors will: a task name with a
    forbidden character, a serializer other than JSON, a ``queue=`` the app cannot route
    to are the same errors as ``apply_delayed`` raises. With ``queue_col`` each row routes
    itself: a row without a queue whose default is unknown is that row's reject."""
    try:
        config = shipping.config(plan.shipped)
        queue_template(shipping.bare_app(plan.shipped), plan.task, plan.options, plan.queue,
                       Keyspace(config.prefix, config.shards))
    except UnknownQueue:
        if plan.queue_col is None:
            raise


def _check_arguments(app, task: str, args_cols: tuple[str, ...], kwargs_type) -> None:
    """Refuse columns the task's function cannot take, when the task is registered on the
    driver's app (with ``typing`` on, as ``apply_delayed`` checks each call): ``args_cols``
    are its positional arguments, a struct ``kwargs_col``'s fields its keywords (a map's
    keys vary by row: then only the positional ones are known)."""
    from pyspark.sql import types as T

    if isinstance(kwargs_type, T.MapType):
        return
    names = kwargs_type.fieldNames() if isinstance(kwargs_type, T.StructType) else []
    try:
        validation.arguments(app.tasks.get(task), [None] * len(args_cols), dict.fromkeys(names))
    except TypeError as exc:
        raise InvalidOption(
            f"{task} cannot be called with these columns ({exc}): args_cols "
            f"{list(args_cols)} are its positional arguments, the fields of kwargs_col "
            f"{names} its keywords") from None


def _declared_options(app, task: str) -> dict[str, Any]:
    """What ``@app.task(queue=..., priority=..., expires=...)`` declared, as ``apply_delayed``
    applies it, when the task is registered on the driver's app (else nothing)."""
    registered = app.tasks.get(task)
    if registered is None:
        return {}
    return {name: value for name, value in registered._get_exec_options().items()
            if value is not None and shipping.plain(value)}


# -- driver-side progress --------------------------------------------------------------


class _Tally:
    """The accumulator of partitions and rows written, ``(partitions, rows)``.

    Each task's copy starts at one partition and no rows, and the task adds the rows it
    writes. Spark merges a result task's copy into the driver's once per partition,
    however often the task ran (a failed attempt's copy is dropped, a second successful
    one ignored), so the driver counts every partition once, with all its rows, and
    never goes back, whatever Spark retries."""

    def zero(self, value: tuple[int, int]) -> tuple[int, int]:
        return 1, 0

    def addInPlace(self, value: tuple[int, int],
                   term: int | tuple[int, int]) -> tuple[int, int]:
        if isinstance(term, int):  # a task adds the rows it wrote
            return value[0], value[1] + term
        return value[0] + term[0], value[1] + term[1]  # the driver merges a task's copy


class _Watcher:
    """Reports partitions as they finish, from the write's ``_Tally`` accumulator."""

    def __init__(self, partitions: int, done, progress: Progress | None,
                 interval: float = 0.5) -> None:
        self.partitions, self.done = partitions, done
        self.progress, self.interval = progress, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delayq-progress", daemon=True)
        self._started = time.monotonic()
        self._last = 0

    def start(self) -> None:
        if self.progress is not None:
            self._thread.start()

    def stop(self) -> None:
        if self.progress is not None:
            self._stop.set()
            self._thread.join(5)
            self._report()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._report()

    def _report(self) -> None:
        partitions, rows = self.done.value
        if self.progress is not None and partitions != self._last:
            self._last = partitions
            self.progress(PartitionProgress(partitions, self.partitions, rows,
                                            time.monotonic() - self._started))
