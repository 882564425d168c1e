"""A job id is one job in the whole store, whatever business key it is scheduled with.

A job lives on the shard of its business key, so the same id with two keys could land on
two shards; ``if_exists`` applies across them, and ``cancel(job_id)`` reaches every copy.
"""

from __future__ import annotations

import threading
import time

import pytest

from celery_delayq.carrier import Carrier
from celery_delayq.errors import DamagedShard, InvalidOption, JobExists
from celery_delayq.scripts import SCRIPTS
from celery_delayq.store.dead_letters import DeadLetters, Replayed
from celery_delayq.store.producing import Producing
from tests.conftest import store_keys
from tests.faults.test_carrier_faults import PARKED


def keys_on_two_shards(delayq, job_id: str = "close-42") -> tuple[str, str]:
    """Two business keys whose jobs live on different shards, neither the shard of
    ``job_id`` itself (where it lives without a key)."""
    shard_for = delayq.store.keys.shard_for
    keys = (f"order:{n}" for n in range(1000)
            if shard_for("", f"order:{n}") is not shard_for(job_id))
    first = next(keys)
    return first, next(k for k in keys if shard_for("", k) is not shard_for("", first))


def stored_copies(delayq, job_id: str) -> int:
    stored = delayq.store.client
    return sum(stored.hexists(shard.jobs, job_id) for shard in delayq.store.keys)


@pytest.mark.parametrize("keys", [(0, 1), (0, None), (None, 0)],
                         ids=["two-keys", "key-then-none", "none-then-key"])
def test_keep_returns_the_job_stored_under_another_key(proj, delayq, redis_client, keys):
    chosen = keys_on_two_shards(delayq)
    first_key, second_key = (None if n is None else chosen[n] for n in keys)
    first = proj.record.apply_delayed(args=(1,), delay=60, job_id="close-42", key=first_key)
    again = proj.record.apply_delayed(args=(2,), delay=60, job_id="close-42", key=second_key)
    assert again.id == first.id
    assert stored_copies(delayq, "close-42") == 1
    assert [(j.job_id, j.args, j.key) for j in delayq.pending()] == [("close-42", [1], first_key)]


def test_error_refuses_the_id_stored_under_another_key_and_writes_nothing(
        proj, delayq, redis_client):
    first_key, second_key = keys_on_two_shards(delayq)
    proj.record.apply_delayed(args=(1,), delay=60, job_id="close-42", key=first_key)
    before = {k: delayq.store.client.dump(k) for k in store_keys(delayq)}
    with pytest.raises(JobExists, match="close-42"):
        proj.record.apply_delayed(args=(2,), delay=60, job_id="close-42", key=second_key,
                                  if_exists="error")
    assert {k: delayq.store.client.dump(k) for k in store_keys(delayq)} == before


def test_replace_moves_the_job_to_its_new_key(proj, delayq, redis_client):
    first_key, second_key = keys_on_two_shards(delayq)
    proj.record.apply_delayed(args=(1,), delay=60, job_id="close-42", key=first_key)
    proj.record.apply_delayed(args=(2,), delay=60, job_id="close-42", key=second_key,
                              if_exists="replace")
    assert stored_copies(delayq, "close-42") == 1
    assert [(j.args, j.key) for j in delayq.pending()] == [([2], second_key)]
    assert delayq.cancel_key(first_key) == 0 and delayq.cancel_key(second_key) == 1


def test_a_batch_applies_if_exists_across_keys(proj, delayq, redis_client):
    first_key, second_key = keys_on_two_shards(delayq)
    proj.record.apply_delayed(args=(0,), delay=60, job_id="dup", key=first_key)
    results = proj.record.apply_delayed_many([
        {"args": (1,), "delay": 60, "job_id": "dup", "key": second_key},
        {"args": (2,), "delay": 60, "job_id": "fresh", "key": second_key},
    ])
    assert [r.job_id for r in results] == ["dup", "fresh"]
    assert stored_copies(delayq, "dup") == 1
    assert sorted((j.job_id, j.args) for j in delayq.pending()) == [("dup", [0]),
                                                                    ("fresh", [2])]


def test_a_batch_giving_one_id_two_shards_is_refused_and_nothing_written(
        proj, delayq, redis_client):
    first_key, second_key = keys_on_two_shards(delayq)
    with pytest.raises(InvalidOption, match="'dup' is given twice in one batch"):
        proj.record.apply_delayed_many([
            {"args": (1,), "delay": 60, "job_id": "dup", "key": first_key},
            {"args": (2,), "delay": 60, "job_id": "dup", "key": second_key},
        ])
    assert [k for k in store_keys(delayq) if k != "delayq:meta"] == []


def test_cancel_reaches_a_copy_two_racing_producers_stored_under_two_keys(
        proj, delayq, redis_client):
    first_key, second_key = keys_on_two_shards(delayq)
    result = proj.record.apply_delayed(args=(1,), delay=0.5, job_id="raced", key=first_key,
                                       queue="parked")
    # the race: a second producer's write landed between the first's check and its write
    home, other = (delayq.store.keys.shard_for("", k) for k in (first_key, second_key))
    client = delayq.store.client  # the store's Redis: a cluster in the cluster pass
    envelope = client.hget(home.jobs, "raced").replace(first_key, second_key)
    client.hset(other.jobs, "raced", envelope)
    client.zadd(other.due, {"raced": client.zscore(home.due, "raced")})
    assert stored_copies(delayq, "raced") == 2

    assert result.cancel() is True
    assert stored_copies(delayq, "raced") == 0
    time.sleep(0.6)
    carrier = Carrier(proj.app)
    carrier.run_once()
    carrier.close()
    assert redis_client.llen("parked") == 0


def test_a_replace_refused_on_its_new_shard_keeps_the_old_copy(proj, delayq, redis_client):
    first_key, second_key = keys_on_two_shards(delayq)
    proj.record.apply_delayed(args=(1,), delay=60, job_id="close-42", key=first_key)
    new_home = delayq.store.keys.shard_for("", second_key)
    delayq.store.client.set(new_home.bykey, "damaged")
    with pytest.raises(DamagedShard):
        proj.record.apply_delayed(args=(2,), delay=60, job_id="close-42", key=second_key,
                                  if_exists="replace")
    assert [(j.args, j.key) for j in delayq.pending()] == [([1], first_key)]


def test_a_replace_stored_on_its_new_shard_leaves_no_old_copy_when_another_shard_refuses(
        proj, delayq, redis_client):
    """Another item of the batch was refused on a third shard: the error was raised before
    the moved job's old copy was cancelled, and the job was stored (and run) twice."""
    first_key, second_key = keys_on_two_shards(delayq)
    shard_for = delayq.store.keys.shard_for
    third_key = next(f"other:{n}" for n in range(1000) if shard_for("", f"other:{n}") not in
                     (shard_for("", first_key), shard_for("", second_key)))
    proj.record.apply_delayed(args=(1,), delay=60, job_id="close-42", key=first_key)
    delayq.store.client.set(shard_for("", third_key).bykey, "damaged")
    with pytest.raises(DamagedShard):
        proj.record.apply_delayed_many([
            {"args": (2,), "delay": 60, "job_id": "close-42", "key": second_key},
            {"args": (3,), "delay": 60, "job_id": "other", "key": third_key}],
            if_exists="replace")
    assert stored_copies(delayq, "close-42") == 1
    assert [(j.args, j.key) for j in delayq.pending()] == [([2], second_key)]


@pytest.mark.parametrize("if_exists", ["keep", "replace", "error"])
def test_producers_racing_with_one_id_under_two_keys_store_one_job(proj, delayq, if_exists):
    """Two threads schedule each id at the same moment, under keys of two shards: the
    store ends with one copy of every id, and what each producer was told is true."""
    first_key, second_key = keys_on_two_shards(delayq)
    ids = [f"race-{n}" for n in range(60)]
    barrier = threading.Barrier(2)
    told: dict[str, dict[str, str]] = {job_id: {} for job_id in ids}

    def produce(key: str) -> None:
        for job_id in ids:
            barrier.wait()
            try:
                result = proj.record.apply_delayed(args=(key,), delay=60, job_id=job_id,
                                                   key=key, if_exists=if_exists)
            except JobExists:
                told[job_id][key] = "refused"
            else:
                told[job_id][key] = result.id

    threads = [threading.Thread(target=produce, args=(key,)) for key in (first_key, second_key)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert [job_id for job_id in ids if stored_copies(delayq, job_id) != 1] == []
    for job in delayq.pending():
        answers = told[job.job_id]
        if if_exists == "keep":  # both were given the one stored job
            assert set(answers.values()) == {job.task_id}, job.job_id
        elif if_exists == "error":  # one stored it, the other was refused
            assert sorted(answers.values()) == sorted([job.task_id, "refused"]), job.job_id
        else:  # the last one stored wins
            assert job.task_id == answers[job.key], job.job_id


def dead_under(proj, delayq, job_id: str, key: str) -> str:
    """``job_id`` scheduled under ``key``, claimed and dead-lettered, as a carrier does it;
    its task id."""
    task_id = proj.record.apply_delayed(args=("dead",), delay=0, job_id=job_id, key=key,
                                        queue=PARKED).id
    store = delayq.store
    for claim in store.claim(list(store.keys), 10, 60_000):
        for job in claim.jobs:
            assert store.dead_letter(claim.shard, job, "unknown queue: gone")
    return task_id


def meanwhile(call) -> tuple[threading.Thread, dict[str, object]]:
    """``call`` started in a thread, given up to half a second to finish (a call that waits
    for the one in hand takes longer); the thread, and its outcome once joined."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["returned"] = call()
        except JobExists as exc:
            outcome["raised"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(0.5)
    return thread, outcome


REPLAYS = {"replay": lambda store: store.replay("close-42"),
           "replay_dead": lambda store: store.replay_dead()}


@pytest.mark.parametrize("replay", list(REPLAYS))
def test_a_schedule_between_a_replays_look_and_its_write_keeps_the_replayed_job(
        proj, delayq, monkeypatch, replay):
    """A producer schedules (keep) the id of a dead letter under a key of another shard
    while a replay has looked for live copies and not yet put the letter back: it waits
    for the replay and is given the replayed job, one copy."""
    dead_key, other_key = keys_on_two_shards(delayq)
    task_id = dead_under(proj, delayq, "close-42", dead_key)
    replay_calls = DeadLetters._replay_calls
    producers = []

    def schedule_first(self, *args, **kwargs):
        producers.append(meanwhile(lambda: proj.record.apply_delayed(
            args=("again",), delay=60, job_id="close-42", key=other_key, if_exists="keep")))
        return replay_calls(self, *args, **kwargs)

    monkeypatch.setattr(DeadLetters, "_replay_calls", schedule_first)
    replayed = REPLAYS[replay](delayq.store)
    [(thread, outcome)] = producers
    thread.join()

    assert replayed in (True, Replayed(replayed=1, live=0, unreadable=0))
    assert stored_copies(delayq, "close-42") == 1
    assert outcome["returned"].id == task_id
    assert [(j.args, j.key) for j in delayq.pending()] == [(["dead"], dead_key)]


@pytest.mark.parametrize("replay", list(REPLAYS))
def test_a_replay_between_a_schedules_look_and_its_write_finds_the_scheduled_job(
        proj, delayq, monkeypatch, replay):
    """A replay of a dead letter while a producer that schedules its id under a key of
    another shard has looked for copies and not yet written its own: it waits for the
    producer, then finds its job and keeps the letter dead."""
    dead_key, other_key = keys_on_two_shards(delayq)
    dead_under(proj, delayq, "close-42", dead_key)
    stored_elsewhere = Producing._stored_elsewhere
    replays = []

    def replay_first(self, *args, **kwargs):
        found = stored_elsewhere(self, *args, **kwargs)
        replays.append(meanwhile(lambda: REPLAYS[replay](delayq.store)))
        return found

    monkeypatch.setattr(Producing, "_stored_elsewhere", replay_first)
    scheduled = proj.record.apply_delayed(args=("again",), delay=60, job_id="close-42",
                                          key=other_key, if_exists="keep")
    [(thread, outcome)] = replays
    thread.join()

    assert stored_copies(delayq, "close-42") == 1
    assert [(j.task_id, j.args, j.key) for j in delayq.pending()] == [
        (scheduled.id, ["again"], other_key)]
    if replay == "replay":
        assert isinstance(outcome["raised"], JobExists)
    else:
        assert outcome["returned"] == Replayed(replayed=0, live=1, unreadable=0)
    assert [letter["job_id"] for letter in delayq.store.dead()] == ["close-42"]


@pytest.mark.parametrize("lacked", ["reserve", "replay", "schedule"])
def test_a_script_redis_lacks_lets_no_call_slip_between_a_look_and_a_write(
        proj, delayq, monkeypatch, lacked):
    """Redis forgets its scripts when it restarts. A call it answers NOSCRIPT did not run,
    and runs again once its script is loaded, after the calls sent behind it: a take after
    the look that had to follow it (``reserve`` lacked: a producer schedules while a replay
    comes in), or a write after the release that had to follow it (``replay`` lacked: a
    producer comes in; ``schedule`` lacked, as after a restart once a producer of another
    version loaded the scripts it shares: a replay comes in). Either way one copy is
    stored, and each is told of the other's."""
    dead_key, other_key = keys_on_two_shards(delayq)
    task_id = dead_under(proj, delayq, "close-42", dead_key)
    client = delayq.store.client
    client.script_flush()
    for script in SCRIPTS.values():
        if script.name != lacked:
            client.script_load(script.source)
    outcome: dict[str, object] = {}

    def schedule() -> None:
        outcome["scheduled"] = proj.record.apply_delayed(
            args=("again",), delay=60, job_id="close-42", key=other_key, if_exists="keep").id

    def replay() -> None:
        try:
            outcome["replayed"] = delayq.store.replay("close-42")
        except JobExists:
            outcome["replayed"] = False

    first, second = (replay, schedule) if lacked == "replay" else (schedule, replay)
    load, others = client.script_load, []

    def load_then_let_the_other_in(source: str):  # the moment the first call waits on
        loaded = load(source)
        if loaded == SCRIPTS[lacked].sha and not others:
            others.append(meanwhile(second))
        return loaded

    monkeypatch.setattr(client, "script_load", load_then_let_the_other_in)
    first()
    [(thread, _)] = others
    thread.join()

    assert stored_copies(delayq, "close-42") == 1
    [job] = delayq.pending()
    assert job.task_id == outcome["scheduled"]
    assert outcome["replayed"] is (job.task_id == task_id)


@pytest.mark.parametrize("given", ["another key", "no key"])
def test_a_job_looked_up_or_rescheduled_under_a_key_not_its_own_is_found(proj, delayq, given):
    """A key given with a job id is where the job is looked for first, not a filter: one id
    is one job whatever its key, so ``get`` and ``reschedule`` (and ``run_now``) find it
    under another key, as ``cancel`` does, rather than calling a pending job gone."""
    own, other = keys_on_two_shards(delayq)
    proj.record.apply_delayed(args=("x",), delay=600, job_id="close-42", key=own)
    hint = other if given == "another key" else None
    assert delayq.get("close-42", key=hint).key == own
    assert delayq.reschedule("close-42", delay=900, key=hint) is not None
    assert delayq.run_now("close-42", key=hint)
    assert delayq.cancel("close-42", key=hint)
