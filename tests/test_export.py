"""``delayq export``: journal streams drained to date-partitioned files, resuming on re-run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import datetime, timezone
from pathlib import Path

import pytest

from celery_delayq.errors import InvalidOption
from celery_delayq.export import COLUMNS, export_journal
from tests.conftest import ROOT, finish


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


def test_a_since_export_leaves_the_regular_export_where_it_stopped(delayq, tmp_path):
    """``--since`` is a look at the journal from a time: had it moved the stored position,
    the next regular export would skip what lay between its position and that time."""
    journal = delayq.store.keys.shard(0).journal
    for n, at in enumerate(["2030-01-01T10:00:00", "2030-01-02T10:00:00",
                            "2030-01-03T10:00:00"]):
        if n == 1:
            export_journal(delayq.store, tmp_path / "regular", fmt="jsonl")
        delayq.store.client.xadd(journal, {"event": "scheduled", "job": f"j{n}"},
                                 id=f"{_ms(at)}-0")

    export_journal(delayq.store, tmp_path / "look", fmt="jsonl", since="2030-01-03")
    export_journal(delayq.store, tmp_path / "regular", fmt="jsonl")

    assert [r["job"] for r in _jsonl(tmp_path / "look")] == ["j2"]
    assert [r["job"] for r in _jsonl(tmp_path / "regular")] == ["j0", "j1", "j2"]


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


def test_a_trimmed_journal_is_reported_though_a_later_shard_fails_the_export(
        delayq, spawn, tmp_path):
    """The export moves past a trimmed shard's gap; a later shard's failure (a full disk,
    a file in the way) must not take the only warning of it with it: a rerun cannot see
    the gap any more."""
    store = delayq.store
    trimmed, failing = store.keys.shard(1), store.keys.shard(2)
    for shard in (trimmed, failing):
        store.client.xadd(shard.journal, {"event": "scheduled", "job": "a"},
                          id=f"{_ms('2030-01-01T10:00:00')}-0")
    out = tmp_path / "events"
    export_journal(store, out, fmt="jsonl")
    for job in ("lost", "kept"):
        store.client.xadd(trimmed.journal, {"event": "scheduled", "job": job})
    store.client.xtrim(trimmed.journal, maxlen=1, approximate=False)
    store.client.xadd(failing.journal, {"event": "scheduled", "job": "b"},
                      id=f"{_ms('2030-01-03T10:00:00')}-0")
    (out / "date=2030-01-03").write_text("in the way")  # the partition cannot be made

    process = spawn("delayq", "export", "--to", str(out), "--format", "jsonl")
    said = finish(process, timeout=60)

    assert process.returncode == 1 and "cannot write the export" in said, said
    assert "shard 1's journal was trimmed past the last entry exported" in said, said


def test_export_in_batches_of_one_writes_every_entry(delayq, redis_client, tmp_path):
    journal = delayq.store.keys.shard(0).journal
    for n in range(3):
        redis_client.xadd(journal, {"event": "scheduled", "job": f"j{n}"})

    result = export_journal(delayq.store, tmp_path, fmt="jsonl", batch=1)

    assert (result.events, result.trimmed) == (3, [])
    assert [r["job"] for r in _jsonl(tmp_path)] == ["j0", "j1", "j2"]


@pytest.mark.parametrize("since", [None, "0"])
def test_export_reports_a_journal_trimmed_between_two_of_its_batches(
        delayq, redis_client, monkeypatch, tmp_path, since):
    journal = delayq.store.keys.shard(0).journal
    before = [redis_client.xadd(journal, {"event": "scheduled", "job": f"j{n}"})
              for n in range(10)]
    read = delayq.store.journal_entries

    def read_while_producers_write(shard, *args):
        entries = read(shard, *args)
        if entries and entries[-1][0] == before[2]:  # the first batch: 5 more, trimmed to 8
            for n in range(5):
                redis_client.xadd(journal, {"event": "scheduled", "job": f"k{n}"})
            redis_client.xtrim(journal, maxlen=8, approximate=False)
        return entries

    monkeypatch.setattr(delayq.store, "journal_entries", read_while_producers_write)
    result = export_journal(delayq.store, tmp_path, fmt="jsonl", batch=3, since=since)

    assert result.trimmed == [0]
    assert [r["job"] for r in _jsonl(tmp_path)] == ["j0", "j1", "j2", "j7", "j8", "j9"]


@pytest.mark.parametrize("since", ["1969-12-31", "0001-01-01", "0001-01-01T00:00:00+14:00",
                                   "-5"])
def test_since_before_the_epoch_exports_the_whole_journal(delayq, redis_client, tmp_path,
                                                         since):
    journal = delayq.store.keys.shard(0).journal
    redis_client.xadd(journal, {"event": "scheduled", "job": "first"}, id="1-1")
    redis_client.xadd(journal, {"event": "scheduled", "job": "now"})

    result = export_journal(delayq.store, tmp_path, fmt="jsonl", since=since)

    assert result.events == 2
    assert [r["job"] for r in _jsonl(tmp_path)] == ["first", "now"]


def test_since_past_the_largest_stream_id_is_refused_before_anything_is_written(
        delayq, redis_client, tmp_path):
    redis_client.xadd(delayq.store.keys.shard(0).journal, {"event": "scheduled", "job": "a"})

    with pytest.raises(InvalidOption, match="largest stream entry id"):
        export_journal(delayq.store, tmp_path / "out", fmt="jsonl",
                       since="18446744073709551616")

    assert not (tmp_path / "out").exists()
    last = export_journal(delayq.store, tmp_path / "last", fmt="jsonl",
                          since="18446744073709551615")
    assert last.events == 0 and last.trimmed == []


@pytest.mark.parametrize("since", ["²", "١٢", "12.5"])
def test_since_that_is_neither_ascii_digits_nor_a_time_is_refused(delayq, redis_client,
                                                                 tmp_path, since):
    with pytest.raises(InvalidOption, match="neither epoch milliseconds"):
        export_journal(delayq.store, tmp_path / "out", fmt="jsonl", since=since)

    assert not (tmp_path / "out").exists()


def test_export_command_refuses_a_since_past_the_largest_stream_id_without_a_traceback(
        delayq, spawn, tmp_path):
    delayq.schedule_many("tests.proj.record", [{"job_id": "s0", "delay": 60}])

    out_dir = tmp_path / "events"
    refused = spawn("delayq", "export", "--to", str(out_dir), "--format", "jsonl",
                    "--since", "18446744073709551616")
    out = finish(refused, timeout=60)
    assert refused.returncode == 1 and "Traceback" not in out, out
    assert "error: --since 18446744073709551616 is past the largest stream entry id" in out
    assert not out_dir.exists()

    everything = spawn("delayq", "export", "--to", str(out_dir), "--format", "jsonl",
                       "--since", "1969-12-31")
    out = finish(everything, timeout=60)
    assert everything.returncode == 0 and "exported 1 events" in out, out


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


def test_an_export_that_fills_the_disk_leaves_no_partial_file_and_resumes(
        delayq, redis_server, tmp_path):
    """A write that failed part way (a full disk; here a file size limit) left its hidden
    partial file behind, keeping the disk full where no one would look."""
    delayq.schedule_many("tests.proj.record", [
        {"job_id": f"j{n}", "delay": 600, "key": "order:1"} for n in range(400)])
    out = tmp_path / "events"
    limited = textwrap.dedent(f"""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (8_000, 8_000))
        from tests import proj
        from celery_delayq.export import export_journal
        export_journal(proj.delayq.store, {str(out)!r}, fmt="jsonl", batch=100)
    """)
    env = dict(os.environ, DELAYQ_TEST_REDIS_URL=redis_server.url, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", limited], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "File too large" in done.stderr, done.stderr[-2000:]
    assert [p.name for p in out.rglob("*.tmp")] == []
    export_journal(delayq.store, out, fmt="jsonl")
    assert sorted(r["job"] for r in _jsonl(out)) == sorted(f"j{n}" for n in range(400))
