"""Dead letters written, dropped and replayed while a job id dies again.

Each test forces one interleaving by running the other party's steps inside the store's own
call, between two of its round trips: a carrier dead-letters a job while a newer call of its
id dies on another shard; ``drop --all`` and ``replay --all`` select letters from a scan
while the letter of an id they selected is replaced by a newer one their filter excludes.
"""

from __future__ import annotations

import pytest

from celery_delayq.scripts import Script
from celery_delayq.store.dead_letters import DeadLetters, Replayed
from tests.faults.test_carrier_faults import PARKED
from tests.store.test_one_id_one_job import keys_on_two_shards

JOB = "close-42"


def dies(delayq, task, label: str, reason: str, key: str | None = None) -> None:
    """``JOB`` scheduled due now as a call of ``task``, claimed and dead-lettered."""
    store = delayq.store
    delayq.schedule(task.name, [label], delay=0, job_id=JOB, key=key, queue=PARKED)
    for claim in store.claim(list(store.keys), 10, 60_000):
        for job in claim.jobs:
            assert store.dead_letter(claim.shard, job, reason)


def letters(delayq) -> list[tuple[str, str]]:
    return [(letter["job_id"], letter["reason"]) for letter in delayq.store.dead(limit=100)]


def test_a_newer_dead_letter_written_while_an_older_one_supersedes_is_kept(
        proj, delayq, monkeypatch):
    """Carrier A dead-letters JOB on one shard; before A removes the id's letters on the
    other shards, JOB is scheduled again under a key of another shard, claimed by carrier B
    and dead-lettered there. B's letter, the newer, is the one left: the job is not lost."""
    first_key, second_key = keys_on_two_shards(delayq, JOB)
    script_call = Script.call

    def b_dies_after_a_dead_script(self, client, keys, args):
        reply = script_call(self, client, keys, args)
        if self.name == "dead":
            monkeypatch.setattr(Script, "call", script_call)
            dies(delayq, proj.record, "second", "B", key=second_key)
        return reply

    proj.record.apply_delayed(args=("first",), delay=0, job_id=JOB, key=first_key,
                              queue=PARKED)
    [(shard, job)] = [(claim.shard, job) for claim in delayq.store.claim(
        list(delayq.store.keys), 10, 60_000) for job in claim.jobs]
    monkeypatch.setattr(Script, "call", b_dies_after_a_dead_script)
    assert delayq.store.dead_letter(shard, job, "A")

    assert letters(delayq) == [(JOB, "B")]
    assert delayq.store.replay(JOB)
    assert [(job.args, job.key) for job in delayq.pending()] == [(["second"], second_key)]


@pytest.mark.parametrize("operation", ["drop", "replay"])
def test_a_letter_replaced_after_the_scan_that_selected_it_is_left_alone(
        proj, delayq, monkeypatch, operation):
    """``drop --all`` / ``replay --all`` of task ``record`` and reason "unknown queue"
    selects JOB's letter; before its call, JOB is scheduled again as a ``plain`` call and
    dies with another reason. That newer letter is not one the filter selects: it stays."""
    dies(delayq, proj.record, "first", "unknown queue: gone")
    call = {"drop": "_drop_call", "replay": "_replay_unless_live"}[operation]
    original = getattr(DeadLetters, call)

    def dies_again_first(self, shard, *args, **kwargs):
        monkeypatch.setattr(DeadLetters, call, original)
        dies(delayq, proj.plain, "second", "timeout: broker down")
        return original(self, shard, *args, **kwargs)

    monkeypatch.setattr(DeadLetters, call, dies_again_first)
    store = delayq.store
    if operation == "drop":
        assert store.drop_dead(task=proj.record.name, reason="unknown queue", by="test") == 0
    else:
        assert store.replay_dead(task=proj.record.name, reason="unknown queue") == Replayed(
            replayed=0, live=0, unreadable=0)

    assert letters(delayq) == [(JOB, "timeout: broker down")]
    assert delayq.pending() == []
