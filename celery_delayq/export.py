"""``celery -A proj delayq export``: drain the journal streams into date-partitioned files.

Each shard's stream is read with ``XRANGE`` from the position the last export stopped at
(kept in the ``<prefix>:export`` hash), up to the stream's end when the export began, and
written as ``DIR/date=YYYY-MM-DD/events-s<shard>-<first entry id>.<parquet|jsonl>``. A file
is written completely (to a temporary name, then renamed) before the position moves on,
so an export killed half-way repeats at most its last batch, under the same file name.
Readers should still de-duplicate on ``(shard, id)``; the Spark report does.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .errors import ConfigurationError, InvalidOption
from .keys import unpack_id
from .store import Store

FORMATS = ("parquet", "jsonl")
#: Fields every event row has (absent ones are null); anything else goes to ``extra`` (JSON).
COLUMNS = ("id", "shard", "ts_ms", "event", "job", "task", "key", "due_ms", "task_id", "by",
           "reason", "retries", "extra")
_KNOWN = frozenset({"event", "job", "task", "key", "due", "task_id", "by", "reason", "retries"})


@dataclass
class ExportResult:
    """What one export wrote."""

    events: int = 0
    files: list[Path] = field(default_factory=list)
    per_shard: dict[int, int] = field(default_factory=dict)
    #: Shards whose stream was trimmed past the last exported entry (events were lost).
    trimmed: list[int] = field(default_factory=list)


def export_journal(store: Store, to: str | os.PathLike, *, since: str | None = None,
                   fmt: str = "parquet", batch: int = 10_000) -> ExportResult:
    """Write every journal entry not yet exported (or since ``since``) under ``to``.

    ``since`` (ISO-8601 time, or epoch milliseconds) starts from that time instead of the
    remembered position; the position is remembered afterwards either way.
    """
    if fmt not in FORMATS:
        raise InvalidOption(f"format must be one of {', '.join(FORMATS)}; got {fmt!r}")
    if fmt == "parquet":
        _require_pyarrow()
    if batch < 1:
        raise InvalidOption("batch must be at least 1")
    start = None if since is None else f"{_since_ms(since)}-0"
    root = Path(to)
    root.mkdir(parents=True, exist_ok=True)
    result = ExportResult()
    client = store.client
    position_key = store.keys.export_position
    with store.unavailable():
        positions = client.hgetall(position_key)
        for shard in store.keys:
            last = positions.get(str(shard.shard))
            result.per_shard[shard.shard] = 0
            end = client.xrevrange(shard.journal, "+", "-", count=1)
            if not end:
                continue
            end_id = end[0][0]
            lower = start or (f"({last}" if last else "-")
            if start is None and last and _trimmed(client, shard.journal, last):
                result.trimmed.append(shard.shard)
            while True:
                entries = client.xrange(shard.journal, lower, end_id, count=batch)
                if not entries:
                    break
                result.files += _write(root, shard.shard, entries, fmt)
                result.events += len(entries)
                result.per_shard[shard.shard] += len(entries)
                last_id = entries[-1][0]
                client.hset(position_key, str(shard.shard), last_id)
                if last_id == end_id:
                    break
                lower = f"({last_id}"
    return result


def _trimmed(client, stream: str, last: str) -> bool:
    """True when entries after ``last`` were trimmed from the stream before export."""
    info = client.xinfo_stream(stream)
    deleted = info.get("max-deleted-entry-id")  # Redis >= 7
    if deleted is not None:
        return _id_tuple(deleted) > _id_tuple(last)
    first = info.get("first-entry")  # older Redis: the oldest entry skipped past ``last``
    return bool(first) and _id_tuple(first[0]) > _id_tuple(last) and not client.xrange(
        stream, last, last)


def _id_tuple(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


def _since_ms(since: str) -> int:
    if since.isdigit():
        return int(since)
    try:
        at = datetime.fromisoformat(since)
    except ValueError:
        raise InvalidOption(
            f"--since {since!r} is neither epoch milliseconds nor an ISO-8601 time such as "
            "2030-01-31 or 2030-01-31T08:00:00+00:00") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    return int(at.timestamp() * 1000)


def row(shard: int, entry_id: str, fields: dict[str, str]) -> dict[str, Any]:
    """One journal entry as an export row (see :data:`COLUMNS`)."""
    ms = int(entry_id.split("-", 1)[0])
    extra = {k: v for k, v in fields.items() if k not in _KNOWN}
    return {
        "id": entry_id, "shard": shard, "ts_ms": ms, "event": fields.get("event"),
        "job": unpack_id(fields["job"]) if fields.get("job") else None,
        "task": fields.get("task") or None,
        "key": fields.get("key") or None, "due_ms": _int(fields.get("due")),
        "task_id": fields.get("task_id") or None, "by": fields.get("by") or None,
        "reason": fields.get("reason") or None, "retries": _int(fields.get("retries")),
        "extra": json.dumps(extra) if extra else None,
    }


def _int(value: str | None) -> int | None:
    if value in (None, ""):
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


def _write(root: Path, shard: int, entries: list, fmt: str) -> list[Path]:
    by_date: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for entry_id, fields in entries:
        record = row(shard, entry_id, fields)
        day = datetime.fromtimestamp(record["ts_ms"] / 1000, timezone.utc).date().isoformat()
        by_date[day].append(record)
    written = []
    for day, records in by_date.items():
        folder = root / f"date={day}"
        folder.mkdir(exist_ok=True)
        path = folder / f"events-s{shard}-{records[0]['id']}.{fmt}"
        tmp = folder / f".{path.name}.tmp"
        if fmt == "parquet":
            _write_parquet(tmp, records)
        else:
            with open(tmp, "w", encoding="utf-8") as out:
                for record in records:
                    out.write(json.dumps(record, separators=(",", ":")) + "\n")
        os.replace(tmp, path)
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
