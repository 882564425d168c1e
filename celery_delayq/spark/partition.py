"""The executor side of ``schedule_dataframe``: one partition's rows into the store.

Only the columns a call uses arrive, as Arrow record batches (``mapInArrow``). Rows are
prepared in slices of ``batch_size``; a background thread writes each slice (pipelined
schedule scripts) while the next one is prepared, so the Python work overlaps the Redis
round trip. The partition yields Arrow batches of its rejects (the used columns and a
reason) and then one summary row (``COUNTS``).

The store keeps the run's outcome per job id (``RunRows``, every row named alike): the
driver leaves one row per id, so a row that comes again (a retried task, which may read
its partition in another order) is answered the first attempt's outcome, never written
twice, nor taken for a second row of its id. Rows whose eta has passed are looked up in
that outcome first: those the run wrote are answered alike, neither counted as past nor
(with past="reject") rejected.
"""

from __future__ import annotations

import decimal
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

import pyarrow as pa
from celery import Celery

from .. import validation
from ..envelope import Call, Template, template
from ..errors import DelayQError, InvalidDelay, InvalidJobId, PayloadError
from ..keys import Keyspace, pack_id
from ..reading import iso_time, utc_of_ms
from ..store import RunRows, ScheduleCode, Scheduled, Store
from ..validation import Due
from . import shipping

#: Output columns besides the used ones: a reject's reason, or (reason null) the
#: partition's counts: scheduled, existed, rejected, past.
REASON, COUNTS = "__delayq_reason", "__delayq_counts"
#: Input column, present when the input has duplicate ids: True on a row another row of
#: its id wins (see ``schedule._source``).
LOST = "__delayq_lost"
REASONS = {
    ScheduleCode.CONFLICT: "job id {!r} already exists (if_exists='error')",
    ScheduleCode.DUPLICATE: "duplicate id in input: another row of it has job id {!r}",
}
_COUNTS_TYPE = pa.list_(pa.int64())


@dataclass(frozen=True)
class Plan:
    """Everything a partition needs, as plain data (pickled to executors)."""

    shipped: dict[str, Any]
    task: str
    id_col: str
    delay_col: str | None
    eta_kind: str | None  # "us" (timestamp), "str", "num" or None
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

    @property
    def used(self) -> tuple[str, ...]:
        """The input columns a call is made of, each once, in a fixed order."""
        named = (self.id_col, self.delay_col, self.eta_col, *self.args_cols,
                 self.kwargs_col, self.key_col, self.queue_col)
        return tuple(dict.fromkeys(name for name in named if name is not None))

    @property
    def fields(self) -> dict[str, str]:
        """The name each used column travels under between Spark and Python: Spark reads
        a dot in a column's name as a struct's field, a backtick as a quote."""
        return {name: f"__delayq_col{n}" for n, name in enumerate(self.used)}


@dataclass(frozen=True)
class _Late:
    """A row whose eta has passed: past (with past="reject", a reject) unless the run
    wrote it."""

    index: int
    job_id: str
    key: str | None


@dataclass
class _Slice:
    """Up to ``batch_size`` rows: their calls for the store, and the rows refused so far."""

    rows: pa.RecordBatch
    rejects: list[tuple[int, str]]  # (row index, reason)
    indexes: list[int]  # the row of each call
    items: list[tuple[Call, Due]]


def write_partition(plan: Plan, batches: Iterable[pa.RecordBatch],
                    done_rows) -> Iterator[pa.RecordBatch]:
    """Schedule one partition's rows; yield its rejects, then its summary row."""
    yield from _Partition(plan, done_rows).run(batches)


class _Partition:
    def __init__(self, plan: Plan, done_rows) -> None:
        self.plan, self.done_rows = plan, done_rows
        self.app = shipping.bare_app(plan.shipped)
        self.config = shipping.config(plan.shipped)
        self.store = Store(self.config)
        self.fields = plan.fields
        self.templates: dict[str | None, Template] = {}  # by queue
        self.counts = [0, 0, 0, 0]  # scheduled, existed, rejected, past
        self.types: list[pa.DataType] = []  # of the used columns, from the first batch

    def run(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        writer = ThreadPoolExecutor(1, thread_name_prefix="delayq-write")
        pending: tuple[_Slice, Future | None] | None = None
        try:
            for batch in batches:
                self.types = self.types or [batch.schema.field(f).type
                                            for f in self.fields.values()]
                for start in range(0, batch.num_rows, self.plan.batch_size):
                    prepared = self._prepare(batch.slice(start, self.plan.batch_size))
                    sent = writer.submit(self._write, prepared) if prepared.items else None
                    if pending is not None:  # written while this slice was prepared
                        yield from self._finish(*pending)
                    pending = prepared, sent
            if pending is not None:
                yield from self._finish(*pending)
        finally:
            writer.shutdown(wait=True)
            self.store.close()
        if self.types:
            yield self._summary()

    def _write(self, prepared: _Slice) -> list[Scheduled]:
        return self.store.schedule(prepared.items, self.plan.if_exists,
                                   RunRows(self.plan.run, [""] * len(prepared.items)))

    def _finish(self, prepared: _Slice, sent: Future | None) -> Iterator[pa.RecordBatch]:
        results: list[Scheduled] = sent.result() if sent is not None else []
        for index, (call, _), result in zip(prepared.indexes, prepared.items, results,
                                            strict=True):
            if result.code is ScheduleCode.KEPT:
                self.counts[1] += 1
            elif result.code in REASONS:
                self.counts[2] += 1
                prepared.rejects.append((index, REASONS[result.code].format(call.job_id)))
            else:
                self.counts[0] += 1
        self.done_rows.add(len(prepared.items))
        if prepared.rejects:
            yield self._rejects(prepared.rows, prepared.rejects)

    def _prepare(self, rows: pa.RecordBatch) -> _Slice:
        """Calls for the rows of one slice; bad rows become rejects. A row whose eta has
        passed counts as past (with past="reject", is a reject) unless this run wrote it
        (in an attempt Spark runs again, or a run given again): that one the store answers
        as it did then."""
        plan, config, fields = self.plan, self.config, self.fields
        prepared = _Slice(rows, [], [], [])
        unreadable: dict[int, str] = {}  # row index -> reason

        def read(name: str) -> list:
            return _values(rows, fields.get(name, name), name, unreadable)

        ids = read(plan.id_col)
        keys = read(plan.key_col) if plan.key_col else None
        when = _due_times(plan, rows)
        args = (list(zip(*(read(c) for c in plan.args_cols), strict=True))
                if plan.args_cols else None)
        kwargs = read(plan.kwargs_col) if plan.kwargs_col else None
        queues = read(plan.queue_col) if plan.queue_col else None
        lost = read(LOST) if LOST in rows.schema.names else None
        now_ms = time.time() * 1000

        def take(indexes: Iterable[int], written: set[int] | None) -> list[_Late]:
            """Add the rows at ``indexes``; return the past ones to look up (``written``
            None), or reject those of them not in ``written``."""
            late = []
            for index in indexes:
                try:
                    if lost is not None and lost[index]:
                        raise InvalidJobId(
                            REASONS[ScheduleCode.DUPLICATE].format(_text(ids[index])))
                    if index in unreadable:
                        raise PayloadError(unreadable[index])
                    if ids[index] is None:
                        raise InvalidJobId(f"null id: {plan.id_col} is empty")
                    job_id = validation.identifier(_text(ids[index]), "job id",
                                                   config.max_id_length)
                    key = keys[index] if keys is not None else None
                    if key is not None:
                        key = validation.identifier(_text(key), "key", config.max_id_length)
                    due = validation.due(*when(index), config.max_delay)
                    if due.at_ms is not None and due.at_ms < now_ms:
                        if written is None:
                            late.append(_Late(index, job_id, key))
                            continue
                        if index not in written:
                            self.counts[3] += 1
                            if plan.past == "reject":
                                raise InvalidDelay(
                                    f"eta in the past: {_iso(due.at_ms)} (past='reject')")
                    queue = queues[index] if queues is not None else plan.queue
                    call = self._template(queue).call(
                        args[index] if args is not None else (),
                        (kwargs[index] if kwargs is not None else None) or {},
                        job_id=job_id, key=key, max_payload_bytes=config.max_payload_bytes,
                        max_nesting=config.max_nesting)
                except (DelayQError, TypeError, ValueError) as exc:
                    self.counts[2] += 1
                    prepared.rejects.append((index, str(exc)))
                    continue
                prepared.indexes.append(index)
                prepared.items.append((call, due))
            return late

        late = take(range(rows.num_rows), None)
        if late:
            take((row.index for row in late), self._written(late))
        return prepared

    def _written(self, rows: list[_Late]) -> set[int]:
        """The indexes of the rows whose job id this run has given a job already: the
        store answers those from the run's outcome, as any row written again. One
        ``HMGET`` per shard, in one round trip."""
        keys, run = self.store.keys, self.plan.run
        by_outcome: dict[str, list[_Late]] = defaultdict(list)
        for row in rows:
            by_outcome[keys.outcome(keys.shard_for(row.job_id, row.key), run)].append(row)
        with self.store.unavailable():
            pipe = self.store.client.pipeline(transaction=False)
            for outcome, late in by_outcome.items():
                pipe.hmget(outcome, [pack_id(row.job_id) for row in late])
            replies = pipe.execute()
        return {row.index for late, found in zip(by_outcome.values(), replies, strict=True)
                for row, first in zip(late, found, strict=True) if first is not None}

    def _template(self, queue: str | None) -> Template:
        """The call options of a queue, resolved once (raises on an unknown queue)."""
        found = self.templates.get(queue)
        if found is None:
            found = self.templates[queue] = queue_template(
                self.app, self.plan.task, self.plan.options, queue, self.store.keys)
        return found

    def _rejects(self, rows: pa.RecordBatch, rejects: list[tuple[int, str]]) -> pa.RecordBatch:
        taken = pa.array([index for index, _ in rejects], pa.int64())
        return pa.RecordBatch.from_arrays(
            [*(rows.column(f).take(taken) for f in self.fields.values()),
             pa.array([reason for _, reason in rejects], pa.string()),
             pa.nulls(len(rejects), _COUNTS_TYPE)],
            names=[*self.fields.values(), REASON, COUNTS])

    def _summary(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [*(pa.nulls(1, kind) for kind in self.types), pa.nulls(1, pa.string()),
             pa.array([self.counts], _COUNTS_TYPE)],
            names=[*self.fields.values(), REASON, COUNTS])


def queue_template(app: Celery, task: str, options: dict[str, Any], queue: str | None,
                   keys: Keyspace) -> Template:
    """The call options of ``task`` sent to ``queue`` (None: where it routes), resolved as
    ``apply_delayed`` resolves them; raises the same errors (a forbidden character in the
    task name, a serializer other than JSON, an unknown queue, one whose broker list would
    be a key of the store)."""
    return template(app, task, options if queue is None else {**options, "queue": queue},
                    keys)


def _values(rows: pa.RecordBatch, field: str, name: str, unreadable: dict[int, str]) -> list:
    """The column ``field`` (the input's ``name``) as Python values fit for JSON: structs
    and maps as dicts, times as ISO text (decimals stay decimals: not JSON). A value
    Python cannot hold (a date past year 9999) is None, and its row's reason goes to
    ``unreadable`` by row index: a reject of that row alone."""
    column = rows.column(field)
    try:
        return _plain_all(column.to_pylist(), column.type)
    except (ArithmeticError, TypeError, ValueError):  # find the rows: convert one by one
        return [_value(column, index, name, unreadable) for index in range(len(column))]


def _value(column: pa.Array, index: int, name: str, unreadable: dict[int, str]) -> Any:
    """The value at ``index``, or None with its reason in ``unreadable``."""
    try:
        return _plain_all([column[index].as_py()], column.type)[0]
    except (ArithmeticError, TypeError, ValueError) as exc:
        unreadable.setdefault(index, f"{name} holds a value Python cannot read ({exc}); "
                                     "cast the column to a string first")
        return None


def _plain_all(values: list, kind: pa.DataType) -> list:
    if pa.types.is_nested(kind) or pa.types.is_temporal(kind) or pa.types.is_binary(kind):
        return [_plain(value, kind) for value in values]
    return values


def _plain(value: Any, kind: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_map(kind):  # (key, item) pairs
        return {k: _plain(v, kind.item_type) for k, v in value}
    if pa.types.is_struct(kind):
        return {field.name: _plain(value[field.name], field.type) for field in kind}
    if isinstance(value, list):
        return [_plain(v, kind.value_type) for v in value]
    if isinstance(value, (bytes, bytearray)):
        raise TypeError("binary columns cannot be task arguments; encode them first")
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return value


def _due_times(plan: Plan, rows: pa.RecordBatch) -> Callable[[int], tuple[Any, Any]]:
    """(delay, eta) of the row at an index, for ``validation.due``."""
    if plan.delay_col is not None:
        delays, column = rows.column(plan.fields[plan.delay_col]).to_pylist(), plan.delay_col

        def delay(index: int) -> tuple[Any, None]:
            value = delays[index]
            if value is None:
                raise InvalidDelay(f"null delay: {column} is empty")
            return (float(value) if isinstance(value, decimal.Decimal) else value), None
        return delay
    assert plan.eta_col is not None
    name, raw = plan.eta_col, rows.column(plan.fields[plan.eta_col])
    if plan.eta_kind == "us":  # an instant: Arrow holds it as µs since the epoch (UTC)
        raw = raw.cast(pa.int64())
    etas = raw.to_pylist()

    def eta(index: int) -> tuple[None, datetime]:
        value = etas[index]
        if value is None:
            raise InvalidDelay(f"bad eta: {name} is empty")
        if plan.eta_kind in ("us", "num"):  # µs of a timestamp, or epoch seconds
            try:
                return None, utc_of_ms(value / 1000 if plan.eta_kind == "us"
                                       else float(value) * 1000)
            except ValueError:
                raise InvalidDelay(f"bad eta: {value!r} is no time from year 1 to 9999 "
                                   f"({'µs' if plan.eta_kind == 'us' else 'epoch seconds'})"
                                   ) from None
        try:
            return None, iso_time(value)
        except ValueError:
            raise InvalidDelay(f"bad eta: {value!r} is not an ISO-8601 time such as "
                               "2030-01-31T08:00:00+00:00") from None
    return eta


def _iso(ms: float) -> str:
    return utc_of_ms(ms).isoformat()


def _text(value: Any) -> str:
    """Ids and keys may be integer columns; they are stored as text."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InvalidJobId(
            f"ids and keys must be string or integer columns, got {type(value).__name__}")
    return str(value)
