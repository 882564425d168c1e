"""Replaying and dropping dead letters: one by id, or all of them (of a task, of a reason)
in chunks.

Dead letters are made as a carrier makes them: jobs are scheduled due now, claimed, and
moved to the dead letters with a reason (``Store.dead_letter``). Unreadable ones are planted
with raw commands beside them, as damaged data would be.
"""

from __future__ import annotations

import json

import pytest

from celery_delayq.errors import JobExists, PayloadError
from celery_delayq.keys import pack_id
from celery_delayq.store import dead_letters
from tests.conftest import command_calls, finish, store_keys
from tests.faults.test_carrier_faults import PARKED

#: dead letter text -> why it cannot be replayed as it is
UNREADABLE = {
    "not json": "not a JSON object",
    '{"reason":"x","at":1}': "no envelope",
    '{"reason":"x","at":1,"envelope":5}': "no envelope",
    "[1,2]": "no envelope",
}


def make_dead(proj, delayq, ids: list[str], reason: str, task=None) -> None:
    """Schedule ``ids`` due now, claim them and dead-letter them with ``reason``."""
    (task or proj.record).apply_delayed_many(
        [{"args": (job_id,), "delay": 0, "job_id": job_id} for job_id in ids], queue=PARKED)
    store = delayq.store
    for claim in store.claim(list(store.keys), 10_000, 60_000):
        for job in claim.jobs:
            assert store.dead_letter(claim.shard, job, reason)


def plant_unreadable(delayq) -> list[str]:
    """The UNREADABLE dead letters, under ids bad-0, bad-1, ... on their own shards."""
    ids = []
    for n, text in enumerate(UNREADABLE):
        job_id = f"bad-{n}"
        delayq.store.client.hset(delayq.store.keys.shard_for(job_id).dead, pack_id(job_id), text)
        ids.append(job_id)
    return ids


def dead_ids(delayq) -> set[str]:
    return {entry["job_id"] for entry in delayq.store.dead(limit=100_000)}


def pending_ids(delayq) -> set[str]:
    return {job.job_id for job in delayq.pending(limit=100_000)}


@pytest.mark.parametrize("text", list(UNREADABLE))
def test_replay_of_an_unreadable_dead_letter_says_so_and_writes_nothing(delayq, text):
    shard = delayq.store.keys.shard_for("bad")
    delayq.store.client.hset(shard.dead, pack_id("bad"), text)

    with pytest.raises(PayloadError, match=f"dead letter 'bad' cannot be replayed: "
                                           f"{UNREADABLE[text]}"):
        delayq.store.replay("bad")

    assert delayq.store.client.hget(shard.dead, pack_id("bad")) == text
    assert not delayq.store.client.hexists(shard.jobs, pack_id("bad"))
    assert pending_ids(delayq) == set()


def test_an_unreadable_dead_letter_replays_with_a_fixed_envelope(proj, delayq):
    bad = plant_unreadable(delayq)[0]  # not JSON
    fixed = f'{{"t":"tests.proj.record","q":"{PARKED}"}}\n["fixed"]\n'

    assert delayq.store.replay(bad, envelope=fixed) is True
    assert pending_ids(delayq) == {bad}


def test_replay_dead_puts_back_every_readable_dead_letter_in_chunks(proj, delayq,
                                                                   monkeypatch):
    monkeypatch.setattr(dead_letters, "DEAD_CHUNK", 7)
    ids = [f"d-{n}" for n in range(60)]
    make_dead(proj, delayq, ids, "unknown queue: gone")
    bad = plant_unreadable(delayq)
    before = command_calls(delayq.store)
    seen: list[int] = []

    outcome = delayq.store.replay_dead(progress=seen.append)

    assert outcome == dead_letters.Replayed(replayed=60, live=0, unreadable=len(bad))
    assert pending_ids(delayq) == set(ids)
    assert dead_ids(delayq) == set(bad)
    # told after each chunk of at most 7 letters: the running count of replayed jobs
    assert len(seen) >= 60 // 7 and seen == sorted(seen) and seen[-1] == 60
    # a replay call per readable letter; per chunk, a look on each other shard for live
    # copies, and a take and a release of the chunk's reservations per shard they are on
    shards = delayq.store.keys.shards
    assert command_calls(delayq.store) - before <= 60 + len(seen) * (shards - 1 + 2 * shards)
    assert all(b - a <= 7 for a, b in zip([0, *seen], seen, strict=False))
    assert delayq.store.replay_dead() == dead_letters.Replayed(0, 0, len(bad))


@pytest.mark.parametrize("action", ["replay", "drop"])
def test_a_dead_letter_whose_id_is_not_utf8_is_replayed_or_dropped_with_the_rest(
        delayq, action):
    """The dead script keeps a damaged job's id as it was (bytes that are not UTF-8): its
    letter goes back as its bytes. (No producer can schedule such an id: none is reserved.)"""
    fixed = f'{{"t":"tests.proj.record","q":"{PARKED}"}}\n["fixed"]\n'
    shard = delayq.store.keys.shard(1)
    delayq.store.client.hset(shard.dead, b"odd:\xff",
                             json.dumps({"at": 1, "reason": "x", "envelope": fixed}))

    if action == "replay":
        assert delayq.store.replay_dead() == dead_letters.Replayed(1, 0, 0)
        assert delayq.store.client.hexists(shard.jobs, b"odd:\xff")
    else:
        assert delayq.store.drop_dead(by="ops") == 1
    assert not delayq.store.client.hexists(shard.dead, b"odd:\xff")


@pytest.mark.parametrize("outcome", ["replayed", "live", "unreadable", "unknown"])
def test_no_reservation_outlives_a_replay(proj, delayq, outcome):
    """A replay holds its ids' reservations (as a producer does) only while it runs."""
    make_dead(proj, delayq, ["d-0"], "unknown queue: gone")
    plant_unreadable(delayq)
    if outcome == "live":
        proj.record.apply_delayed(("again",), delay=600, job_id="d-0", key="other-shard")
    job_id = {"unreadable": "bad-0", "unknown": "nobody"}.get(outcome, "d-0")

    try:
        delayq.store.replay(job_id)
    except (JobExists, PayloadError):
        assert outcome in ("live", "unreadable")
    delayq.store.replay_dead()

    assert [key for key in store_keys(delayq) if ":reserved:" in key] == []


def test_replay_dead_selects_by_task_and_reason(proj, delayq):
    make_dead(proj, delayq, [f"q-{n}" for n in range(10)], "unknown queue: gone")
    make_dead(proj, delayq, [f"h-{n}" for n in range(5)], "http 500 from partner")
    make_dead(proj, delayq, [f"s-{n}" for n in range(4)], "unknown queue: gone",
              task=proj.slow)

    assert delayq.store.replay_dead(reason="unknown queue", task="tests.proj.record") \
        == dead_letters.Replayed(10, 0, 0)
    assert pending_ids(delayq) == {f"q-{n}" for n in range(10)}
    assert delayq.store.replay_dead(task="tests.proj.slow").replayed == 4
    assert dead_ids(delayq) == {f"h-{n}" for n in range(5)}


def test_replay_dead_keeps_a_dead_letter_whose_id_a_live_job_has(proj, delayq):
    make_dead(proj, delayq, ["twice", "once"], "unknown queue: gone")
    proj.record.apply_delayed(("again",), delay=600, job_id="twice", key="other-shard")

    assert delayq.store.replay_dead() == dead_letters.Replayed(replayed=1, live=1, unreadable=0)
    assert dead_ids(delayq) == {"twice"}
    with pytest.raises(JobExists):
        delayq.store.replay("twice")


def test_cli_replays_all_dead_letters_of_a_reason_and_reports_what_it_kept(
        proj, delayq, spawn):
    make_dead(proj, delayq, [f"c-{n}" for n in range(12)], "unknown queue: gone")
    make_dead(proj, delayq, ["keep-1"], "http 500 from partner")
    plant_unreadable(delayq)

    process = spawn("delayq", "replay", "--all", "--reason-contains", "queue")
    output = finish(process)
    assert process.returncode == 1, output  # the unreadable ones may be of that reason
    assert f"replayed 12 dead jobs; kept dead: {len(UNREADABLE)} unreadable" in output, output
    assert dead_ids(delayq) == {"keep-1", *(f"bad-{n}" for n in range(len(UNREADABLE)))}

    process = spawn("delayq", "replay", "--all")
    output = finish(process)
    assert process.returncode == 1, output  # some stay dead: the operator must look
    assert "replayed 1 dead job" in output and f"{len(UNREADABLE)} unreadable" in output
    assert dead_ids(delayq) == {f"bad-{n}" for n in range(len(UNREADABLE))}


@pytest.mark.parametrize("command", ["replay", "drop"])
@pytest.mark.parametrize("args", [[], ["j1", "--all"], ["j1", "--task", "t"]])
def test_cli_replay_and_drop_take_one_id_or_all(spawn, command, args):
    process = spawn("delayq", command, *args)
    output = finish(process)
    assert process.returncode == 2 and "JOB_ID or --all" in output, output


def test_drop_gives_up_a_dead_letter_for_good_and_journals_it_as_cancelled(proj, delayq):
    make_dead(proj, delayq, ["d-0", "d-1"], "unknown queue: gone")
    cancels = delayq.store.counts()[1]

    assert delayq.store.drop("d-0", by="ops: queue removed") is True
    assert delayq.store.drop("d-0", by="ops: queue removed") is False

    assert dead_ids(delayq) == {"d-1"} and delayq.get("d-0") is None
    [entry] = [e for shard in delayq.store.keys for _, e in
               delayq.store.client.xrange(shard.journal) if e["event"] == "cancelled"]
    assert (entry["job"], entry["task"], entry["by"]) == ("d-0", "tests.proj.record",
                                                          "ops: queue removed")
    assert delayq.store.counts()[1] == cancels + 1


def test_drop_dead_selects_by_task_and_reason_and_without_either_drops_unreadable_ones(
        proj, delayq, monkeypatch):
    monkeypatch.setattr(dead_letters, "DEAD_CHUNK", 3)
    make_dead(proj, delayq, [f"q-{n}" for n in range(10)], "unknown queue: gone")
    make_dead(proj, delayq, [f"h-{n}" for n in range(5)], "http 500 from partner")
    bad = plant_unreadable(delayq)

    assert delayq.store.drop_dead(reason="unknown queue", by="ops") == 10
    assert dead_ids(delayq) == {*(f"h-{n}" for n in range(5)), *bad}
    assert delayq.store.drop_dead(task="tests.proj.record", reason="500", by="ops") == 5
    assert delayq.store.drop_dead(by="ops") == len(bad)
    assert dead_ids(delayq) == set()


def test_cli_drops_all_selected_dead_letters_once_confirmed(proj, delayq, spawn):
    make_dead(proj, delayq, [f"c-{n}" for n in range(6)], "unknown queue: gone")
    make_dead(proj, delayq, ["keep-1"], "http 500 from partner")

    process = spawn("delayq", "drop", "--all", "--reason-contains", "queue")
    output = finish(process)  # no answer to the question: nothing dropped
    assert process.returncode == 1 and "Aborted" in output, output
    assert len(dead_ids(delayq)) == 7

    process = spawn("delayq", "drop", "--all", "--reason-contains", "queue", "--yes")
    output = finish(process)
    assert process.returncode == 0 and "dropped 6 dead jobs" in output, output
    process = spawn("delayq", "drop", "keep-1")
    assert finish(process).strip() == "keep-1: dropped" and process.returncode == 0
    assert dead_ids(delayq) == set()


@pytest.mark.parametrize("dies_again", ["claimed", "buried"])
def test_a_job_id_dead_again_under_another_key_keeps_only_its_newest_dead_letter(
        proj, delayq, dies_again):
    """A job id has one dead letter. Scheduled again after it died, under a business key of
    another shard, and dead again (its claim dead-lettered by a carrier, or buried by a
    worker out of retries), the new dead letter supersedes the old one, as on one shard:
    replay puts back the newest call, not the one it replaced (a Hypothesis run of
    test_store_model found the two letters)."""
    store, job_id = delayq.store, "order:42:close"
    key = next(f"order:{n}" for n in range(100)
               if store.keys.shard_for(job_id, f"order:{n}") is not store.keys.shard_for(job_id))
    make_dead(proj, delayq, [job_id], "first")
    if dies_again == "claimed":
        proj.record.apply_delayed(args=("second",), delay=0, job_id=job_id, key=key,
                                  queue=PARKED)
        for claim in store.claim(list(store.keys), 10, 60_000):
            for job in claim.jobs:
                assert store.dead_letter(claim.shard, job, "second")
    else:
        envelope = store.dead(limit=1)[0]["envelope"].replace(f'["{job_id}"]', '["second"]')
        store.bury(job_id, key, envelope, "second")
    assert [letter["reason"] for letter in store.dead(limit=10)] == ["second"]
    assert store.replay(job_id)
    assert [job.args for job in delayq.pending()] == [["second"]]
