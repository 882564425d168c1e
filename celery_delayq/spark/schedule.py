"""``schedule_dataframe``: one delayed Celery task per DataFrame row, idempotent by job id.

Each partition opens one store connection and writes its rows through the schedule
script in pipelined batches. Rows that cannot be scheduled come back in a rejects
DataFrame (the input columns plus ``reason``); none is dropped silently. Executors
build envelopes from a shipped copy of the app's routing config (:mod:`.shipping`),
so they need this package installed, not the project's task code.

Each row is written at most once per call, however often Spark runs its task: the rows
are named by partition and position, and the store keeps what the call did with each
(``RunRows``), so a retried task answers the first outcome and writes nothing. Summary
and rejects come from one collect on the driver, so reading the rejects later computes
nothing again.
"""

from __future__ import annotations

import decimal
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import date, datetime, timezone
from typing import TYPE_CHECKING, Any

from celery.exceptions import QueueNotFound

from .. import validation
from ..envelope import build
from ..errors import DelayQError, InvalidDelay, InvalidJobId, InvalidOption
from ..store import RunRows, ScheduleCode, Store
from . import shipping

if TYPE_CHECKING:
    from celery import Celery
    from pyspark.sql import DataFrame

#: Hidden column holding an eta as microseconds since the epoch (exact, timezone-free).
_ETA_US = "__delayq_eta_us"
_SUMMARY, _REJECT = 0, 1
#: The thread-local properties ``setJobGroup`` sets.
_LABELS = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
_REASONS = {
    ScheduleCode.CONFLICT: "job id {!r} already exists (if_exists='error')",
    ScheduleCode.DUPLICATE: "duplicate id in input: another row of it has job id {!r}",
}

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


@dataclass(frozen=True)
class _Plan:
    """Everything a partition needs, as plain data (pickled to executors)."""

    shipped: dict[str, Any]
    task: str
    columns: tuple[str, ...]
    id_col: str
    delay_col: str | None
    eta_kind: str | None  # "us" (hidden micros column), "str", "num" or None
    eta_col: str | None
    args_cols: tuple[str, ...]
    kwargs_col: str | None
    key_col: str | None
    queue: str | None
    queue_col: str | None
    options: dict[str, Any]
    if_exists: str
    batch_size: int
    past: str  # "run" or "reject": what an eta that has passed does
    run: str  # names this call's rows in the store (RunRows)


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
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    plan = _plan(df, app, task, id_col, delay_col, eta_col, args_cols, kwargs_col, key_col,
                 queue, queue_col, options, if_exists, batch_size, past)
    if run is not None:
        plan = replace(plan, run=run)
    source = df
    if plan.eta_kind == "us" and eta_col is not None:
        source = df.withColumn(_ETA_US, F.unix_micros(F.col(eta_col)))
    spark = df.sparkSession
    sc = spark.sparkContext
    done_rows = sc.accumulator(0)
    outcomes = source.rdd.mapPartitions(lambda rows: _write_partition(plan, rows, done_rows))
    group = f"delayq-schedule-{plan.run}"
    labels = {name: sc.getLocalProperty(name) for name in _LABELS}  # the caller's, restored
    sc.setJobGroup(group, f"celery-delayq: schedule {task} from a DataFrame")
    watcher = _Watcher(sc, group, outcomes.getNumPartitions(), done_rows, progress)
    watcher.start()
    try:
        collected = outcomes.collect()  # the one job that writes: nothing computes it again
    finally:
        watcher.stop()
        for name, value in labels.items():  # None removes it (pyspark's hint says str)
            sc.setLocalProperty(name, value)  # type: ignore[arg-type]
    if run is None:
        Store(shipping.config(plan.shipped)).forget_run(plan.run)
    counts = [record for kind, record in collected if kind == _SUMMARY]
    scheduled, existed, rejected, late = (sum(c[n] for c in counts) for n in range(4))
    schema = T.StructType([*df.schema.fields, T.StructField("reason", T.StringType(), False)])
    rejects = spark.createDataFrame(
        [record for kind, record in collected if kind == _REJECT], schema)
    return Summary(scheduled, existed, rejected, late), rejects


def _plan(df, app, task, id_col, delay_col, eta_col, args_cols, kwargs_col, key_col, queue,
          queue_col, options, if_exists, batch_size, past) -> _Plan:
    """Check the arguments against the DataFrame on the driver, before any write."""
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
    if _ETA_US in types:
        raise InvalidOption(f"the DataFrame may not have a column named {_ETA_US!r}")
    eta_kind = None
    if eta_col is not None:
        eta_type = df.schema[eta_col].dataType
        if isinstance(eta_type, (T.TimestampType, T.TimestampNTZType)):
            eta_kind = "us"
        elif isinstance(eta_type, T.StringType):
            eta_kind = "str"
        elif isinstance(eta_type, T.NumericType):
            eta_kind = "num"
        else:
            raise InvalidOption(f"eta_col {eta_col!r} is {eta_type.simpleString()}; use a "
                                "timestamp, an ISO-8601 string with offset, or epoch seconds")
    if kwargs_col is not None and not isinstance(df.schema[kwargs_col].dataType,
                                                 (T.StructType, T.MapType)):
        raise InvalidOption(f"kwargs_col {kwargs_col!r} must be a struct or map column")
    options = dict(options or {})
    for name in ("queue", "task_id", "countdown", "eta"):
        if name in options:
            raise InvalidOption(f"options may not set {name!r}; use the matching argument")
    options = {**_declared_options(app, task), **options}
    return _Plan(
        shipped=shipping.ship(app, task), task=task, columns=tuple(df.columns),
        id_col=id_col, delay_col=delay_col, eta_kind=eta_kind, eta_col=eta_col,
        args_cols=args_cols, kwargs_col=kwargs_col, key_col=key_col, queue=queue,
        queue_col=queue_col, options=options, if_exists=if_exists, batch_size=batch_size,
        past=past, run=uuid.uuid4().hex)


def _declared_options(app, task: str) -> dict[str, Any]:
    """What ``@app.task(queue=..., priority=..., expires=...)`` declared, as ``apply_delayed``
    applies it, when the task is registered on the driver's app (else nothing)."""
    registered = app.tasks.get(task)
    if registered is None:
        return {}
    return {name: value for name, value in registered._get_exec_options().items()
            if value is not None and shipping.plain(value)}


# -- executor side ---------------------------------------------------------------------


def _write_partition(plan: _Plan, rows: Iterable, done_rows) -> Iterator[tuple]:
    """Schedule one partition's rows; yield its rejects, then one summary record."""
    from pyspark import TaskContext

    app = shipping.bare_app(plan.shipped)
    config = shipping.config(plan.shipped)
    store = Store(config)
    width = len(plan.columns)
    context = TaskContext.get()
    assert context is not None  # this runs in a Spark task
    partition = context.partitionId()
    scheduled = existed = rejected = late = 0
    batch: list[tuple[tuple, Any, Any, str]] = []  # values, call, due, the row's name

    def flush() -> Iterator[tuple]:
        nonlocal scheduled, existed, rejected
        results = store.schedule([(call, due) for _, call, due, _ in batch], plan.if_exists,
                                 RunRows(plan.run, [name for *_, name in batch]))
        for (values, call, _, _), result in zip(batch, results, strict=True):
            if result.code is ScheduleCode.KEPT:
                existed += 1
            elif result.code in (ScheduleCode.CONFLICT, ScheduleCode.DUPLICATE):
                rejected += 1
                yield _REJECT, (*values, _REASONS[result.code].format(call.job_id))
            else:
                scheduled += 1
        done_rows.add(len(batch))
        batch.clear()

    try:
        for position, row in enumerate(rows):
            values = tuple(row[:width])
            try:
                call, due = _prepare(plan, app, config, row)
                if due.at_ms is not None and due.at_ms < time.time() * 1000:
                    late += 1
                    if plan.past == "reject":
                        raise InvalidDelay(f"eta in the past: {_iso(due.at_ms)} (past='reject')")
            except (DelayQError, QueueNotFound, TypeError, ValueError) as exc:
                rejected += 1
                yield _REJECT, (*values, _reason(exc))
                continue
            batch.append((values, call, due, f"{partition}:{position}"))
            if len(batch) >= plan.batch_size:
                yield from flush()
        if batch:
            yield from flush()
    finally:
        store.close()
    yield _SUMMARY, (scheduled, existed, rejected, late)


def _prepare(plan: _Plan, app, config, row) -> tuple:
    job_id = row[plan.id_col]
    if job_id is None:
        raise InvalidJobId(f"null id: {plan.id_col} is empty")
    job_id = validation.identifier(_text(job_id), "job id", config.max_id_length)
    key = row[plan.key_col] if plan.key_col else None
    if key is not None:
        key = validation.identifier(_text(key), "key", config.max_id_length)
    due = validation.due(*_when(plan, row), config.max_delay)
    args = [_plain(row[c]) for c in plan.args_cols]
    kwargs = _plain(row[plan.kwargs_col]) if plan.kwargs_col else None
    if kwargs is None:
        kwargs = {}
    options = dict(plan.options)
    queue = row[plan.queue_col] if plan.queue_col else plan.queue
    if queue is not None:
        options["queue"] = queue
    call = build(app, plan.task, args, kwargs, options, job_id=job_id, key=key,
                 max_payload_bytes=config.max_payload_bytes,
                 max_nesting=config.max_nesting, task_type=None)
    return call, due


def _when(plan: _Plan, row) -> tuple[Any, datetime | None]:
    """(delay, eta) of a row, for ``validation.due``."""
    if plan.delay_col is not None:
        delay = row[plan.delay_col]
        if delay is None:
            raise InvalidDelay(f"null delay: {plan.delay_col} is empty")
        if isinstance(delay, decimal.Decimal):
            delay = float(delay)
        return delay, None
    if plan.eta_kind == "us":
        micros = row[_ETA_US]
        if micros is None:
            raise InvalidDelay(f"bad eta: {plan.eta_col} is empty")
        return None, datetime.fromtimestamp(micros / 1_000_000, timezone.utc)
    raw = row[plan.eta_col]
    if raw is None:
        raise InvalidDelay(f"bad eta: {plan.eta_col} is empty")
    if plan.eta_kind == "num":
        return None, datetime.fromtimestamp(float(raw), timezone.utc)
    try:
        return None, datetime.fromisoformat(raw)
    except ValueError:
        raise InvalidDelay(
            f"bad eta: {raw!r} is not an ISO-8601 time such as 2030-01-31T08:00:00+00:00"
        ) from None


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat()


def _text(value: Any) -> str:
    """Ids and keys may be integer columns; they are stored as text."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InvalidJobId(
            f"ids and keys must be string or integer columns, got {type(value).__name__}")
    return str(value)


def _plain(value: Any) -> Any:
    """Spark values as JSON-friendly data: Rows become dicts, dates ISO strings."""
    from pyspark.sql import Row

    if isinstance(value, Row):
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        raise TypeError("binary columns cannot be task arguments; encode them first")
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return value


def _reason(exc: BaseException) -> str:
    if isinstance(exc, QueueNotFound):
        return f"unknown queue: {exc.args[0] if exc.args else exc}"
    return str(exc)


# -- driver-side progress --------------------------------------------------------------


class _Watcher:
    """Polls Spark's status tracker and reports partitions as they finish."""

    def __init__(self, sc, group: str, partitions: int, done_rows,
                 progress: Progress | None, interval: float = 0.5) -> None:
        self.sc, self.group, self.partitions = sc, group, partitions
        self.done_rows, self.progress, self.interval = done_rows, progress, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delayq-progress", daemon=True)
        self._started = time.monotonic()
        self._last = -1

    def start(self) -> None:
        if self.progress is not None:
            self._thread.start()

    def stop(self) -> None:
        if self.progress is not None:
            self._stop.set()
            self._thread.join(5)
            self._report(self.partitions)

    def _run(self) -> None:
        tracker = self.sc.statusTracker()
        while not self._stop.wait(self.interval):
            done = 0
            for job_id in tracker.getJobIdsForGroup(self.group):
                job = tracker.getJobInfo(job_id)
                for stage_id in (job.stageIds if job else ()):
                    stage = tracker.getStageInfo(stage_id)
                    if stage is not None:
                        done = max(done, stage.numCompletedTasks)
            self._report(done)

    def _report(self, done: int) -> None:
        if self.progress is not None and done != self._last:
            self._last = done
            self.progress(PartitionProgress(done, self.partitions, self.done_rows.value,
                                            time.monotonic() - self._started))
