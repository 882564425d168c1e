"""Two ``delayq export`` runs at once (a cron overlap, a run stalled past its lock): one
runs, the other is refused, and no event ends up in no file."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from celery_delayq.errors import DelayQError
from celery_delayq.export import export_journal
from tests.conftest import finish


def _exported_ids(root: Path) -> set[str]:
    return {json.loads(line)["id"] for path in root.rglob("*.jsonl")
            for line in path.read_text().splitlines()}


def _schedule(delayq, prefix: str, n: int) -> None:
    delayq.schedule_many("tests.proj.record", [
        {"job_id": f"{prefix}{i}", "delay": 3600, "key": "one-shard"} for i in range(n)])


class _StalledAfterReading:
    """The store, but the first journal read of the run stalls until ``go`` is set."""

    def __init__(self, store):
        self.store, self.read, self.go = store, threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self.store, name)

    def journal_entries(self, *args, **kwargs):
        entries = self.store.journal_entries(*args, **kwargs)
        if not self.read.is_set():
            self.read.set()
            assert self.go.wait(30)
        return entries


def _start(target) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = target()
        except Exception as exc:  # the test looks at it
            outcome["error"] = exc
    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_a_second_export_is_refused_while_one_runs_and_says_for_how_long(delayq, tmp_path):
    _schedule(delayq, "a", 5)
    stalled = _StalledAfterReading(delayq.store)
    thread, first = _start(lambda: export_journal(stalled, tmp_path, fmt="jsonl"))
    assert stalled.read.wait(30)

    with pytest.raises(DelayQError, match=r"another delayq export has been running for "
                                          r"\d+ s .*wait for it to end"):
        export_journal(delayq.store, tmp_path, fmt="jsonl")

    stalled.go.set()
    thread.join(30)
    assert first["result"].events == 5
    assert export_journal(delayq.store, tmp_path, fmt="jsonl").events == 0  # released


def test_the_export_command_refused_while_another_runs_exits_1_without_a_traceback(
        delayq, spawn, tmp_path):
    _schedule(delayq, "a", 5)
    stalled = _StalledAfterReading(delayq.store)
    thread, _ = _start(lambda: export_journal(stalled, tmp_path / "a", fmt="jsonl"))
    assert stalled.read.wait(30)
    try:
        process = spawn("delayq", "export", "--to", str(tmp_path / "b"), "--format", "jsonl")
        said = finish(process, timeout=60)
    finally:
        stalled.go.set()
        thread.join(30)

    assert process.returncode == 1 and "Traceback" not in said, said
    assert "error: another delayq export has been running for" in said, said


class _StalledAfterSaving:
    """The store, but the run stalls after its first saved position until ``go`` is set."""

    def __init__(self, store):
        self.store, self.saved, self.go = store, threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self.store, name)

    def save_export_position(self, *args):
        self.store.save_export_position(*args)
        if not self.saved.is_set():
            self.saved.set()
            assert self.go.wait(30)


def test_an_export_whose_lock_expired_while_it_stalled_loses_no_event(delayq, tmp_path):
    """The reviewer's overlap: run A read the journal's end and stalled past its lock; run
    B wrote its first batch; A then wrote its shorter batch under the same file name and
    saved its position before B saved a later one: the events between the two ends were
    in no file, and never exported."""
    store = delayq.store
    _schedule(delayq, "old", 10)
    export_journal(store, tmp_path, fmt="jsonl", batch=100)
    _schedule(delayq, "a", 50)
    stalled_a, stalled_b = _StalledAfterReading(store), _StalledAfterSaving(store)
    thread_a, run_a = _start(lambda: export_journal(stalled_a, tmp_path, fmt="jsonl",
                                                    batch=100))
    assert stalled_a.read.wait(30)
    store.client.delete(store.keys.export_lock)  # A's lock expired meanwhile
    _schedule(delayq, "b", 150)
    thread_b, run_b = _start(lambda: export_journal(stalled_b, tmp_path, fmt="jsonl",
                                                    batch=100))
    assert stalled_b.saved.wait(30)
    stalled_a.go.set()
    thread_a.join(30)
    stalled_b.go.set()
    thread_b.join(30)
    export_journal(store, tmp_path, fmt="jsonl", batch=100)

    journal = {entry_id for shard in store.keys
               for entry_id, _ in store.client.xrange(shard.journal)}
    assert len(journal - _exported_ids(tmp_path)) == 0
    assert run_b["result"].events == 200
    assert "lost its lock" in str(run_a.get("error")), run_a


def test_the_export_position_never_moves_back(delayq, redis_client):
    store = delayq.store
    shard = store.keys.shard(0)
    store.save_export_position(shard, "20-3")
    store.save_export_position(shard, "9-0")  # a stale run's older position
    store.save_export_position(shard, "20-2")
    assert store.export_positions() == {"0": "20-3"}
    store.save_export_position(shard, "100-0")
    assert store.export_positions() == {"0": "100-0"}
