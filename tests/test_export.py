"""``delayq export``: journal streams drained to date-partitioned files, resuming on re-run."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from celery_delayq.export import COLUMNS, export_journal
from tests.conftest import finish


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp() * 1000)


def _jsonl(root: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(root.rglob("*.jsonl"))
            for line in path.read_text().splitlines()]


def test_export_writes_each_event_once_and_resumes_where_it_stopped(delayq, tmp_path):
    delayq.schedule_many("tests.proj.record", [
        {"job_id": f"j{n}", "delay": 600, "args": [n]} for n in range(30)])
    delayq.cancel("j0")

    first = export_journal(delayq.store, tmp_path, fmt="jsonl", batch=7)
    delayq.schedule_many("tests.proj.record", [
        {"job_id": f"k{n}", "delay": 600} for n in range(5)])
    second = export_journal(delayq.store, tmp_path, fmt="jsonl")
    third = export_journal(delayq.store, tmp_path, fmt="jsonl")

    assert (first.events, second.events, third.events) == (31, 5, 0)
    rows = _jsonl(tmp_path)
    assert len({(r["shard"], r["id"]) for r in rows}) == len(rows) == 36
    events = sorted(r["event"] for r in rows)
    assert events == ["cancelled"] + ["scheduled"] * 35
    scheduled = next(r for r in rows if r["job"] == "j3")
    assert set(scheduled) == set(COLUMNS)
    assert scheduled["task"] == "tests.proj.record"
    assert scheduled["due_ms"] - scheduled["ts_ms"] == pytest.approx(600_000, abs=1_000)


def test_export_partitions_parquet_files_by_event_date(delayq, redis_client, tmp_path):
    import pyarrow.parquet as pq

    journal = delayq.store.keys.shard(2).journal
    delayq.store.client.xadd(journal, {"event": "promoted", "job": "a", "task": "t", "due": "5"},
                      id=f"{_ms('2030-01-01T23:59:59')}-0")
    delayq.store.client.xadd(journal, {"event": "started", "job": "a", "retries": "0", "x": "y"},
                      id=f"{_ms('2030-01-02T00:00:01')}-0")

    result = export_journal(delayq.store, tmp_path)

    assert result.events == 2 and result.per_shard[2] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "_backlog", "date=2030-01-01", "date=2030-01-02"]
    day1 = pq.read_table(tmp_path / "date=2030-01-01").to_pylist()
    day2 = pq.read_table(tmp_path / "date=2030-01-02").to_pylist()
    assert [(r["event"], r["due_ms"], r["shard"]) for r in day1] == [("promoted", 5, 2)]
    assert (day2[0]["event"], day2[0]["retries"], json.loads(day2[0]["extra"])) == (
        "started", 0, {"x": "y"})


def test_export_writes_a_snapshot_of_the_backlog_beside_the_events(delayq, redis_client,
                                                                  tmp_path):
    delayq.schedule_many("tests.proj.record", [
        {"job_id": f"j{n}", "delay": 600} for n in range(5)])
    delayq.schedule_many("tests.proj.slow", [{"job_id": "due-now", "delay": 0}])

    result = export_journal(delayq.store, tmp_path)

    assert result.backlog is not None and result.backlog.parent == tmp_path / "_backlog"
    snapshot = json.loads(result.backlog.read_text())
    assert snapshot["at_ms"] == pytest.approx(delayq.store.now_ms(), abs=5_000)
    assert sum(s["pending"] for s in snapshot["shards"]) == 6
    assert sum(s["overdue"] for s in snapshot["shards"]) == 1
    assert {"shard", "pending", "overdue", "inflight", "dead"} <= set(snapshot["shards"][0])
    assert snapshot["tasks"] == {"tests.proj.record": 5, "tests.proj.slow": 1}


def test_since_exports_again_from_that_time(delayq, redis_client, tmp_path):
    journal = delayq.store.keys.shard(0).journal
    for n, at in enumerate(["2030-01-01T10:00:00", "2030-01-02T10:00:00"]):
        delayq.store.client.xadd(journal, {"event": "scheduled", "job": f"j{n}"}, id=f"{_ms(at)}-0")
    export_journal(delayq.store, tmp_path / "all", fmt="jsonl")

    again = export_journal(delayq.store, tmp_path / "again", fmt="jsonl", since="2030-01-02")

    assert [r["job"] for r in _jsonl(tmp_path / "again")] == ["j1"]
    assert again.events == 1


def test_export_reports_a_journal_trimmed_past_the_last_export(delayq, redis_client,
                                                               tmp_path):
    journal = delayq.store.keys.shard(1).journal
    delayq.store.client.xadd(journal, {"event": "scheduled", "job": "a"})
    export_journal(delayq.store, tmp_path, fmt="jsonl")
    delayq.store.client.xadd(journal, {"event": "scheduled", "job": "lost"})
    delayq.store.client.xadd(journal, {"event": "scheduled", "job": "kept"})
    delayq.store.client.xtrim(journal, maxlen=1, approximate=False)

    result = export_journal(delayq.store, tmp_path, fmt="jsonl")

    assert result.trimmed == [1]
    assert [r["job"] for r in _jsonl(tmp_path)] == ["a", "kept"]


def test_celery_delayq_export_command_writes_files_and_says_how_many(delayq, spawn,
                                                                     tmp_path):
    delayq.schedule_many("tests.proj.record", [{"job_id": f"c{n}", "delay": 60}
                                               for n in range(4)])

    out_dir = tmp_path / "events"
    process = spawn("delayq", "export", "--to", str(out_dir), "--format", "jsonl")
    out = finish(process, timeout=60)

    assert process.returncode == 0, out
    assert "exported 4 events" in out
    assert len(_jsonl(out_dir)) == 4


def test_a_damaged_journal_key_stops_only_its_shards_export(delayq, spawn, tmp_path):
    delayq.schedule_many("tests.proj.record", [{"job_id": f"d{n}", "delay": 60}
                                               for n in range(20)])
    damaged = delayq.store.keys.shard_for("d0")
    delayq.store.client.delete(damaged.journal)
    delayq.store.client.set(damaged.journal, "not a stream")
    elsewhere = sum(1 for n in range(20) if delayq.store.keys.shard_for(f"d{n}") != damaged)

    result = export_journal(delayq.store, tmp_path / "api", fmt="jsonl")
    assert result.events == elsewhere and list(result.damaged) == [damaged.shard]

    process = spawn("delayq", "export", "--to", str(tmp_path / "cli"), "--format", "jsonl")
    out = finish(process, timeout=60)
    assert process.returncode == 1 and "Traceback" not in out, out
    assert f"shard {damaged.shard}'s journal cannot be read" in out and "exported 0" in out
