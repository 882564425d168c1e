"""``delayq check`` while an operator pauses: the jobs a pause made during the check holds
are neither reported stranded nor given back by ``--repair``."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from celery_delayq.check import _ShardCheck, check
from celery_delayq.scripts import SCRIPTS
from tests.carrier.test_pause import serve_once

KEY = "order:1"
PAST = datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize("repair", [False, True])
def test_jobs_a_pause_made_during_check_holds_are_not_stranded_nor_given_back(
        proj, app, delayq, monkeypatch, repair):
    """A resume stopped part way left three jobs held with no pause in force (stranded).
    While check looks at them, after it read the shard's pauses, the operator pauses their
    queue: they are held by that pause now, so check must not report nor release them."""
    store, task = delayq.store, proj.record
    shard = store.keys.shard_for("", KEY)
    delayq.pause(task=task.name)
    for n in range(3):
        task.apply_delayed(args=(n,), eta=PAST, job_id=f"held-{n}", key=KEY)
    serve_once(app)
    assert [job.held for job in delayq.pending(key=KEY)] == ["paused"] * 3
    pause = SCRIPTS["pause"]  # a resume whose release never ran: the pause is unmarked
    for each in store.keys:
        pause.call(store.client, pause.keys_for(each),
                   [0, "resume", f"task:{task.name}", "test", "stopped"])
    queue = store.config.default_queue
    paused = []
    look = _ShardCheck._stranded

    def look_then_pause(self, *args):
        found = look(self, *args)
        if self.shard == shard and not paused:  # the operator, right after the look
            paused.append(delayq.pause(queue=queue))
        return found

    monkeypatch.setattr(_ShardCheck, "_stranded", look_then_pause)

    [report] = [r for r in check(store, repair=repair) if r.shard == shard.shard]

    assert paused
    assert report.found["stranded"] == 0 and report.repaired["stranded"] == 0
    assert [(job.job_id, job.held) for job in delayq.pending(key=KEY)] == [
        (f"held-{n}", "paused") for n in range(3)]


@pytest.mark.parametrize("repair", [False, True])
def test_stranded_jobs_are_found_when_redis_forgot_the_scripts(proj, app, delayq, repair):
    """The stranded jobs' transaction meets NOSCRIPT (a restarted Redis): it ran nothing,
    the script is loaded and they are looked at again."""
    store, task = delayq.store, proj.record
    delayq.pause(task=task.name)
    for n in range(3):
        task.apply_delayed(args=(n,), eta=PAST, job_id=f"held-{n}", key=KEY)
    serve_once(app)
    for shard in store.keys:
        store.client.hdel(shard.paused, f"task:{task.name}")  # its pause record is gone
    store.client.script_flush()

    found = check(store, repair=repair)

    assert sum(r.found["stranded"] for r in found) == 3
    assert [job.held for job in delayq.pending(key=KEY)] == ["" if repair else "paused"] * 3
