"""``celery -A proj delayq export``: drain the journal streams into date-partitioned files.

Each shard's stream is read with ``XRANGE`` from the position the last export stopped at
(kept in the ``<prefix>:export`` hash), up to the stream's end when the export began, and
written as ``DIR/date=YYYY-MM-DD/events-s<shard>-<first entry id>.<parquet|jsonl>``. A file
is written completely (to a temporary name, then renamed) before the position moves on,
so an export killed half-way repeats at most its last batch, under the same file name.
Readers should still de-duplicate on ``(shard, id)``; the Spark report does. Each batch is
read from the entry exported last, inclusive, so a journal trimmed past it, before the run
or between two of its batches, is seen and reported (:attr:`ExportResult.trimmed`); so is a
journal made again below it (Redis lost it, and its clock is behind the old one's), which
is then exported from its beginning, and the position moved back to it.

One export runs at a time: a run holds the store's export lock (``<prefix>:exporting``),
renewed at each batch, and another is refused (:class:`ExportRunning`). A run that stalled
past the lock stops before its next batch; a saved position only moves forward.

Each run also writes what was stored when it began, ``DIR/_backlog/backlog-<Redis ms>.json``:
``{"at_ms", "shards": [{"shard", "pending", "overdue", "inflight", "dead"}, ...],
"tasks": {task: jobs pending or in flight}}`` (Spark's readers skip folders named ``_*``).

An entry field that cannot be read (a ``due`` that is no time, text that is not UTF-8, an
id that is not a job id) is null in its column and kept as text in ``extra`` under
``unreadable``; an entry whose own id is no time (after the year 9999) is skipped. Both are
counted in :attr:`ExportResult.unreadable` and logged once per export.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timezone
from pathlib import Path
from typing import Any

from .errors import ConfigurationError, DamagedShard, DelayQError, InvalidOption
from .reading import (
    MAX_MS,
    MIN_MS,
    Unreadable,
    datetime_of_ms,
    is_text,
    iso_time,
    job_id_of,
    printable,
)
from .store import Store
from .store.streams import EXPORT_LOCK_MS

FORMATS = ("parquet", "jsonl")
BACKLOG = "_backlog"  #: the folder of backlog snapshots under the export's root
_BACKLOG_COUNTS = ("shard", "pending", "overdue", "inflight", "dead")
#: Fields every event row has (absent ones are null); anything else goes to ``extra`` (JSON).
COLUMNS = ("id", "shard", "ts_ms", "event", "job", "task", "key", "due_ms", "task_id", "by",
           "reason", "retries", "extra")
_TEXT = ("event", "task", "key", "task_id", "by", "reason")  # columns holding a field as is
_KNOWN = frozenset({*_TEXT, "job", "due", "retries"})
_INT32 = 2**31 - 1
_STREAM_ID = re.compile(r"\d+-\d+")
_MS = re.compile(r"-?[0-9]+")  # --since as epoch milliseconds
_MAX_ID_MS = 2**64 - 1  # the largest ms part of a stream entry id
logger = logging.getLogger(__name__)


@dataclass
class ExportResult:
    """What one export wrote."""

    events: int = 0
    files: list[Path] = field(default_factory=list)
    per_shard: dict[int, int] = field(default_factory=dict)
    #: Shards whose stream was trimmed past the entry exported last, before this run or
    #: between two of its batches, or made again below it (events were lost).
    trimmed: list[int] = field(default_factory=list)
    #: Entries skipped or written with a field that could not be read (see the module doc).
    unreadable: int = 0
    #: Shards whose journal could not be read (a damaged key: DamagedShard's message).
    damaged: dict[int, str] = field(default_factory=dict)
    #: The snapshot of the backlog taken as the export began.
    backlog: Path | None = None


class ExportRunning(DelayQError):
    """Another export holds the export's lock, or this one lost it while it stalled."""


def export_journal(store: Store, to: str | os.PathLike, *, since: str | None = None,
                   fmt: str = "parquet", batch: int = 10_000,
                   on_trimmed: Callable[[int], object] | None = None) -> ExportResult:
    """Write every journal entry not yet exported (or since ``since``) under ``to``.

    ``on_trimmed`` is told a shard's number as soon as its journal is found trimmed past
    the entry exported last (:attr:`ExportResult.trimmed`): the export moves past the
    gap, so a later failure of the run must not take the only word of it with it.
    ``ExportRunning`` when another export runs (or this one loses its lock).

    ``since`` (ISO-8601 time, or epoch milliseconds; before the epoch: from the start)
    starts from that time instead of the remembered position, which it leaves as it was:
    the next export without it goes on from there, skipping nothing.
    """
    if fmt not in FORMATS:
        raise InvalidOption(f"format must be one of {', '.join(FORMATS)}; got {fmt!r}")
    if fmt == "parquet":
        _require_pyarrow()
    if batch < 1:
        raise InvalidOption("batch must be at least 1")
    if not os.fspath(to):
        raise InvalidOption("the export folder (--to) is empty: name the folder to export "
                            "into, e.g. --to ./journal (`.` for the current one)")
    start = None if since is None else f"{_since_ms(since)}-0"
    token = store.export_token()
    holder = store.take_export_lock(token)
    if holder is not None:
        raise ExportRunning(_running(store, holder))
    try:
        return _export(store, Path(to), start, fmt, batch, on_trimmed, token)
    finally:
        with contextlib.suppress(DelayQError):  # else it expires by itself
            store.release_export_lock(token)


def _running(store: Store, holder: str) -> str:
    """Why an export is refused while ``holder`` (the lock's value) runs."""
    began, _, where = holder.partition(" ")
    with store.unavailable():
        now = store.now_ms()
    since = (f"has been running for {max(now - int(began), 0) // 1000} s "
             f"(on {where.rsplit(' ', 1)[0]})" if began.isdigit() else "is running")
    return (f"another delayq export {since}: wait for it to end. If it died, its lock "
            f"{store.keys.export_lock} expires {EXPORT_LOCK_MS // 1000} s after its last "
            "batch; or delete that key once you are sure no export runs")


def _export(store: Store, root: Path, start: str | None, fmt: str, batch: int,
            on_trimmed: Callable[[int], object] | None, token: str) -> ExportResult:
    root.mkdir(parents=True, exist_ok=True)
    result = ExportResult(backlog=_write_backlog(store, root))
    skipped = Unreadable("delayq export", logger)
    exported = store.export_positions()
    for shard in store.keys:
        last = exported.get(str(shard.shard))
        if last is not None and not _STREAM_ID.fullmatch(last):
            logger.warning("delayq export: the export position of shard %d is %r, not a "
                           "stream entry id; exporting that shard from its beginning",
                           shard.shard, printable(last))
            last = None
        result.per_shard[shard.shard] = 0
        try:
            end_id = store.journal_end(shard)
            if end_id is None:
                continue
            # Each batch but a --since run's first is read from the entry exported last,
            # inclusive: when that entry is missing, the journal may be trimmed past it.
            lower, after = (start, None) if start else (last or "-", last)
            back_from = None  # the saved position, when the journal was made again below it
            while True:
                entries = store.journal_entries(shard, lower, end_id,
                                                batch + (after is not None))
                if after is not None:
                    if entries and entries[0][0] == after:
                        entries = entries[1:]
                    elif shard.shard not in result.trimmed:
                        lost = store.journal_lost_after(shard, after)
                        if lost is not None:
                            result.trimmed.append(shard.shard)
                            if on_trimmed is not None:
                                on_trimmed(shard.shard)
                        if lost == after:
                            logger.warning(
                                "delayq export: shard %d's journal was made again below "
                                "the last entry exported, %s (Redis lost it, and its clock "
                                "is behind the old one's): the events after that entry are "
                                "lost; exporting the new journal from its beginning",
                                shard.shard, after)
                            lower, after, back_from = "-", None, after
                            continue
                if not entries:
                    break
                if not store.renew_export_lock(token):
                    raise ExportRunning(
                        f"this export lost its lock {store.keys.export_lock} (it stalled "
                        f"past {EXPORT_LOCK_MS // 1000} s; another export may have run): "
                        f"stopped before writing shard {shard.shard}'s next batch. What it "
                        "wrote is kept; run the export again")
                result.files += _write(root, shard.shard, entries, fmt, skipped)
                result.events += len(entries)
                result.per_shard[shard.shard] += len(entries)
                last_id = entries[-1][0]
                if start is None:
                    store.save_export_position(shard, last_id, back_from)
                    back_from = None
                if last_id == end_id:
                    break
                lower = after = last_id
        except DamagedShard as exc:  # the other shards are exported
            logger.error("delayq export: shard %d's journal cannot be read: %s",
                         shard.shard, exc)
            result.damaged[shard.shard] = str(exc)
    skipped.log()
    result.unreadable = skipped.count
    return result


def _write_backlog(store: Store, root: Path) -> Path:
    """Write the jobs stored now, per shard and per task (see the module doc)."""
    shards = store.stats()
    tasks, _ = store.counts()
    at_ms = shards[0]["now_ms"]
    folder = root / BACKLOG
    folder.mkdir(exist_ok=True)
    path = folder / f"backlog-{at_ms}.json"
    with _replacing(path) as tmp:
        tmp.write_text(json.dumps({
            "at_ms": at_ms, "shards": [{k: s[k] for k in _BACKLOG_COUNTS} for s in shards],
            "tasks": tasks}), encoding="utf-8")
    return path


@contextlib.contextmanager
def _replacing(path: Path) -> Iterator[Path]:
    """A hidden file beside ``path`` to write, put in its place once written; removed when
    the writing fails (a full disk: a partial file would keep it full, unseen)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _since_ms(since: str) -> int:
    """``--since`` as the ms part of a stream entry id: 0 for a time before the epoch;
    ``InvalidOption`` past the largest id, or for text that is neither a number nor a time."""
    if _MS.fullmatch(since):
        ms = int(since)
        if ms > _MAX_ID_MS:
            raise InvalidOption(
                f"--since {since} is past the largest stream entry id ({_MAX_ID_MS} ms); "
                "give a time up to the year 9999, or epoch milliseconds")
        return max(ms, 0)
    try:
        at = iso_time(since)
    except ValueError:
        raise InvalidOption(
            f"--since {since!r} is neither epoch milliseconds nor an ISO-8601 time such as "
            "2030-01-31 or 2030-01-31T08:00:00+00:00") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    return max(int(at.timestamp() * 1000), 0)


def row(shard: int, entry_id: str,
        fields: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    """One journal entry as an export row (see :data:`COLUMNS`), and the names of its
    fields that could not be read: null in their column, kept in ``extra`` as text."""
    record: dict[str, Any] = {"id": entry_id, "shard": shard,
                              "ts_ms": int(entry_id.split("-", 1)[0])}
    unreadable: dict[str, str] = {}
    for name in _TEXT:
        value = fields.get(name) or None
        record[name] = value if value is None or is_text(value) else None
    job = fields.get("job") or None
    record["job"] = None if job is None else job_id_of(job)
    record["due_ms"] = _int(fields.get("due"), MIN_MS, MAX_MS)
    record["retries"] = _int(fields.get("retries"), 0, _INT32)
    for name, column in (*((n, n) for n in _TEXT), ("job", "job"), ("due", "due_ms"),
                         ("retries", "retries")):
        if fields.get(name) and record[column] is None:
            unreadable[name] = printable(fields[name])
    extra: dict[str, Any] = {printable(k): printable(v) for k, v in fields.items()
                             if k not in _KNOWN}
    if unreadable:
        extra["unreadable"] = unreadable
    record["extra"] = json.dumps(extra) if extra else None
    return {column: record[column] for column in COLUMNS}, list(unreadable)


def _int(value: str | None, low: int, high: int) -> int | None:
    """``value`` as an integer; None when absent or not a number from ``low`` to ``high``."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return int(number) if low <= number <= high else None


def _write(root: Path, shard: int, entries: list, fmt: str,
           skipped: Unreadable) -> list[Path]:
    by_date: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for entry_id, fields in entries:
        day = datetime_of_ms(entry_id.split("-", 1)[0])
        if day is None:
            skipped.add(f"entry {entry_id} of shard {shard}", "its id is no time")
            continue
        record, unreadable = row(shard, entry_id, fields)
        if unreadable:
            skipped.add(f"entry {entry_id} of shard {shard}",
                        f"unreadable {', '.join(unreadable)}")
        by_date[day.date().isoformat()].append(record)
    written = []
    for date, records in by_date.items():
        folder = root / f"date={date}"
        folder.mkdir(exist_ok=True)
        path = folder / f"events-s{shard}-{records[0]['id']}.{fmt}"
        with _replacing(path) as tmp:
            if fmt == "parquet":
                _write_parquet(tmp, records)
            else:
                with open(tmp, "w", encoding="utf-8") as out:
                    for record in records:
                        out.write(json.dumps(record, separators=(",", ":")) + "\n")
        written.append(path)
    return written


def parquet_schema():
    """The Arrow schema of exported events."""
    import pyarrow as pa

    text = pa.string()
    return pa.schema([
        ("id", text), ("shard", pa.int32()), ("ts_ms", pa.int64()), ("event", text),
        ("job", text), ("task", text), ("key", text), ("due_ms", pa.int64()),
        ("task_id", text), ("by", text), ("reason", text), ("retries", pa.int32()),
        ("extra", text),
    ])


def _write_parquet(path: Path, records: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(records, schema=parquet_schema()), path)


def _require_pyarrow() -> None:
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ConfigurationError(
            "Parquet export needs pyarrow: pip install 'celery-delayq[spark]', or export "
            "JSON lines with --format jsonl") from None
