"""``delayq export`` of a journal made again below its saved position (Redis lost its data
and the new server's clock is behind the old one)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from celery_delayq.export import export_journal
from tests.conftest import finish


def _jobs(root: Path) -> list[str]:
    return sorted(json.loads(line)["job"] for path in root.rglob("*.jsonl")
                  for line in path.read_text().splitlines())


def _made_again_below(store, shard, jobs: list[str], below_ms: int) -> None:
    store.client.delete(shard.journal)
    for n, job in enumerate(jobs):
        store.client.xadd(shard.journal, {"event": "scheduled", "job": job},
                          id=f"{below_ms - 600_000 + n}-0")


def _exported_then_made_again(store, tmp_path, jobs: list[str]):
    """Shard 0's journal with one job exported, then made again below that position
    holding ``jobs``; the shard."""
    shard = store.keys.shard(0)
    store.client.xadd(shard.journal, {"event": "scheduled", "job": "old"})
    export_journal(store, tmp_path, fmt="jsonl")
    _made_again_below(store, shard, jobs, int(store.export_positions()["0"].split("-")[0]))
    return shard


def test_an_export_reads_a_journal_made_again_below_its_position_from_the_beginning(
        delayq, redis_client, tmp_path, caplog):
    store = delayq.store
    shard = _exported_then_made_again(store, tmp_path, ["new0", "new1", "new2"])
    told: list[int] = []

    with caplog.at_level(logging.WARNING, logger="celery_delayq.export"):
        result = export_journal(store, tmp_path, fmt="jsonl", batch=2, on_trimmed=told.append)

    assert (result.events, result.trimmed, told) == (3, [0], [0])
    assert _jobs(tmp_path) == ["new0", "new1", "new2", "old"]
    assert "made again below the last entry exported" in caplog.text, caplog.text
    assert store.export_positions()["0"] == store.journal_end(shard)  # moved back to it
    store.client.xadd(shard.journal, {"event": "scheduled", "job": "later"})
    again = export_journal(store, tmp_path, fmt="jsonl")
    assert (again.events, again.trimmed) == (1, [])


def test_the_export_command_says_it_reads_a_journal_made_again_from_its_beginning(
        delayq, redis_client, spawn, tmp_path):
    _exported_then_made_again(delayq.store, tmp_path, ["new0"])

    process = spawn("delayq", "export", "--to", str(tmp_path), "--format", "jsonl")
    said = finish(process, timeout=60)

    assert process.returncode == 0 and "exported 1 events" in said, said
    assert "shard 0's journal was made again below the last entry exported" in said, said
