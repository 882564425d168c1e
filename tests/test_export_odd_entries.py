"""``delayq export`` on odd journal entries: every entry is written, or skipped and counted;
an unreadable field is null in its column and kept as text in ``extra``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from celery_delayq.export import export_journal

TASK = "tests.proj.record"
#: Journal entries no carrier or producer writes, planted next to healthy ones.
ODD_ENTRIES: list[tuple[dict, str]] = [  # (fields, the field that is unreadable)
    ({"event": "scheduled", "job": "odd:abc", "task": TASK, "due": "abc"}, "due"),
    ({"event": "scheduled", "job": "odd:1e30", "task": TASK, "due": "1e30"}, "due"),
    ({"event": "scheduled", "job": "odd:inf", "task": TASK, "due": "inf"}, "due"),
    ({"event": "scheduled", "job": "odd:nan", "task": TASK, "due": "nan"}, "due"),
    ({"event": "started", "job": "odd:retries", "retries": "99999999999"}, "retries"),
    ({"event": "scheduled", "job": b"odd:\xff", "task": TASK}, "job"),
    ({"event": "scheduled", "job": "~!!", "task": TASK}, "job"),
    ({"event": "scheduled", "job": "odd:task", "task": b"t\xff"}, "task"),
]


def _jsonl(root: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(root.rglob("*.jsonl"))
            for line in path.read_text().splitlines()]


@pytest.fixture
def odd_journal(delayq, redis_client):
    """20 healthy scheduled events, the odd entries above on shard 1, and on shard 2 an
    entry whose id is after the year 9999."""
    delayq.schedule_many(TASK, [{"job_id": f"good:{n}", "delay": 600} for n in range(20)])
    journal = delayq.store.keys.shard(1).journal
    for fields, _ in ODD_ENTRIES:
        redis_client.xadd(journal, fields)
    redis_client.xadd(journal, {"event": "cancelled", "job": "odd:extra", b"x\xff": b"\xfe"})
    redis_client.xadd(delayq.store.keys.shard(2).journal, {"event": "scheduled", "job": "late"},
                      id="18446744073709551614-0")


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_export_writes_healthy_and_odd_entries_and_logs_the_unreadable_once(
        delayq, odd_journal, tmp_path, caplog, fmt):
    caplog.set_level(logging.WARNING)

    result = export_journal(delayq.store, tmp_path, fmt=fmt)

    if fmt == "parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(tmp_path).to_pylist()
    else:
        rows = _jsonl(tmp_path)
    good = sorted(r["job"] for r in rows if (r["job"] or "").startswith("good:"))
    assert good == sorted(f"good:{n}" for n in range(20))
    assert all(r["due_ms"] > r["ts_ms"] for r in rows if (r["job"] or "").startswith("good:"))
    odd = [r for r in rows if not (r["job"] or "").startswith("good:")]
    assert len(odd) == len(ODD_ENTRIES) + 1  # the entry after the year 9999 is skipped
    for (_, bad), record in zip(ODD_ENTRIES, odd, strict=False):
        column = {"due": "due_ms"}.get(bad, bad)
        assert record[column] is None, (bad, record)
        assert bad in json.loads(record["extra"])["unreadable"], record
    assert json.loads(odd[1]["extra"])["unreadable"]["due"] == "1e30"
    assert json.loads(odd[5]["extra"])["unreadable"]["job"] == "odd:\\xff"
    assert json.loads(odd[-1]["extra"]) == {"x\\xff": "\\xfe"}
    assert (result.events, result.unreadable) == (20 + len(ODD_ENTRIES) + 2,
                                                   len(ODD_ENTRIES) + 1)
    [warning] = [r.getMessage() for r in caplog.records if r.name == "celery_delayq.export"]
    assert f"{len(ODD_ENTRIES) + 1} unreadable" in warning

    assert export_journal(delayq.store, tmp_path, fmt=fmt).events == 0  # positions moved on


def test_a_damaged_export_position_restarts_that_shard_from_the_beginning(
        delayq, redis_client, tmp_path, caplog):
    # A session worker started earlier (Celery's start_worker, loglevel "error") leaves the
    # root logger at ERROR: the warning would not reach caplog.
    caplog.set_level(logging.WARNING, logger="celery_delayq.export")
    delayq.schedule_many(TASK, [{"job_id": f"good:{n}", "delay": 600} for n in range(20)])
    export_journal(delayq.store, tmp_path / "first", fmt="jsonl")
    redis_client.hset(delayq.store.keys.export_position, "0", "abc")

    again = export_journal(delayq.store, tmp_path / "again", fmt="jsonl")

    assert again.events == again.per_shard[0] == len(
        redis_client.xrange(delayq.store.keys.shard(0).journal))
    assert any("position" in r.getMessage() for r in caplog.records)
