"""The store against a reference model: Hypothesis drives the public API on a real Redis.

Each example starts from an empty store and runs a random sequence of schedule /
schedule_many (if_exists keep, replace, error), cancel, cancel_key, reschedule, run_now,
claim (every shard), ack, recover (expired leases), release, dead_letter, bury (a worker out
of retries), replay, a replace or cancel of an id a carrier holds, and pause /
resume of a task or of the default queue (a claim holds a due job of what is paused: it
stays pending, listed as paused, until a resume, a reschedule or a replace; a resume cut
short as the pause ends leaves it held until a carrier goes on with that resume), with
job ids and business keys chosen to collide: ids that differ only by case, UUIDs in
canonical form (stored packed), ``~``-prefixed ids and an id equal to another's packed form,
unicode. After every step, what the store says (``get``, ``pending`` in due order, by key
and by task, ``stats``, ``counts``, ``dead``) must agree with the model.

The model says what a job *should* be: one job id is one job in the whole store, whatever
its business key (issue 15, point 4): ``if_exists`` applies across keys, and a batch that
gives one id business keys of two shards is refused whole.

Due times are absolute (``eta``): far in the past (due) or far in the future (not due),
one second apart so the due order is total; ``run_now``, ``recover`` and ``replay`` make a
job due on Redis's clock, which the model reads back and checks against Redis's clock
before and after the call.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import astuple, dataclass, field
from datetime import datetime, timedelta, timezone
from unittest import mock

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from celery_delayq import decoding, envelope
from celery_delayq.errors import InvalidOption, JobExists
from celery_delayq.keys import pack_id
from celery_delayq.store import CancelOutcome, Claimed, Promoted, ShardClaim, releasing
from celery_delayq.store.releasing import Releasing
from tests.conftest import FUZZ_SCALE, examples

UUID = "0b5f6c2e-7f3a-4d2b-9c1e-2a3b4c5d6e7f"
JOB_IDS = [
    "a", "A", "~", "~a", "~~a", "order:42:close",
    UUID, UUID.upper(), UUID.replace("-4d2b-", "-1d2b-"),  # packed, and two that are not
    pack_id(UUID),  # the stored form of UUID, as an id of its own
    "é", "e\u0301", "ключ", "\U0001f642 x", "\xa0\u200b",
]
KEYS = [None, "order:1", "order:10", "order:1:x", "ключ", "~k", "K", "k", "\u200b"]
TASKS = ["t.alpha", "t.beta", "tâche.ü"]
PAST = datetime(2001, 1, 1, tzinfo=timezone.utc)
FUTURE = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(days=300)
LONG_LEASE_MS = 600_000  # never expires during a test; a lease of 0 has expired at once
BATCH = 1000  # more than a store of this test ever holds: a claim takes every due job


@dataclass
class Call:
    """What a job's stored envelope says (its task id is known once it is written)."""

    task: str
    key: str | None
    args: list  # [the step's number]: two calls of one task and key still differ
    task_id: str = ""


@dataclass
class Lease:
    """A job id in one shard's in-flight set, under the lease of the claim that put it."""

    token: str
    expired: bool
    call: Call  # the call the carrier holds


@dataclass
class Model:
    """One job id as the model sees it."""

    stored: Call | None = None  # the envelope in the jobs hash (pending or being promoted)
    due_ms: int | None = None  # on the due set: pending
    # shard -> its lease: a carrier holds a copy there. A job replaced under a key of
    # another shard while in flight keeps that lease on the shard it left (without an
    # envelope there), and may be claimed on its new shard meanwhile: two leases.
    leases: dict[int, Lease] = field(default_factory=dict)
    dead: Call | None = None  # dead-lettered
    held: bool = False  # pending, due, and held by a pause (a claim found it paused)
    stranded: bool = False  # held, and no pause holds it since a resume cut short: the
    # store has it held until a carrier goes on with that resume (it is never claimed)

    def unhold(self) -> None:
        self.held = self.stranded = False


@dataclass
class Held:
    """A claim a carrier holds: it will publish the job, then ack (or release, bury) it."""

    claim: Claimed
    shard: object
    call: Call


@dataclass
class Expected:
    """What one schedule call should answer: the call it wrote, or the one it kept."""

    code: str  # "created", "kept", "conflict"
    call: Call | None = None
    due_ms: int | None = None


ids = st.sampled_from(JOB_IDS)
keys = st.sampled_from(KEYS)
tasks = st.sampled_from(TASKS)
pauses = st.sampled_from([("task", task) for task in TASKS] + [("queue", None)])


def ms_of(moment: datetime | None) -> int | None:
    return None if moment is None else round(moment.timestamp() * 1000)


# Preconditions are named functions: Hypothesis describes a lambda by parsing its source,
# which took most of three minutes on Python 3.10.
def holding(machine: StoreMachine) -> bool:
    return bool(machine.held)


def holding_due_jobs(machine: StoreMachine) -> bool:
    return any(job.held for job in machine.jobs.values())


def stranding(machine: StoreMachine) -> bool:
    return any(job.stranded for job in machine.jobs.values())


def leases_expired(machine: StoreMachine) -> bool:
    return any(lease.expired for job in machine.jobs.values() for lease in job.leases.values())


class StoreMachine(RuleBasedStateMachine):
    def __init__(self, delayq) -> None:
        super().__init__()
        self.delayq = delayq
        self.store = delayq.store
        stale = list(self.store.client.scan_iter(f"{self.store.keys.prefix}:*"))
        if stale:
            self.store.client.delete(*stale)
        self.jobs: dict[str, Model] = {job_id: Model() for job_id in JOB_IDS}
        self.held: list[Held] = []
        self.paused: set[str] = set()  # pausing.field of each pause in force
        self.cancelled = 0
        self.seq = 0
        self.scheduled: set[str] = set()  # ids, keys and tasks ever scheduled: the others
        self.keys_used: set[str] = set()  # can only be absent, which the listings and
        self.tasks_used: set[str] = set()  # totals check (and skipping them keeps a step fast)

    @initialize()
    def start(self) -> None:
        assert self.store.pending() == []

    # -- helpers -----------------------------------------------------------------------

    def eta(self, due: bool) -> datetime:
        self.seq += 1
        return (PAST if due else FUTURE) + timedelta(seconds=self.seq)

    def expect_schedule(self, job_id: str, call: Call, due_ms: int, if_exists: str
                        ) -> Expected:
        """The model's answer to one schedule call, applied to the model."""
        self.scheduled.add(job_id)
        self.tasks_used.add(call.task)
        if call.key:
            self.keys_used.add(call.key)
        job = self.jobs[job_id]
        if job.stored is not None and if_exists != "replace":
            if if_exists == "error":
                return Expected("conflict")
            return Expected("kept", job.stored, job.due_ms)
        job.stored, job.due_ms = call, due_ms
        job.unhold()
        return Expected("created", call, due_ms)

    @staticmethod
    def check_result(result, expected: Expected, job_id: str) -> None:
        """Results are checked in call order, so a call kept from earlier in the same
        batch already knows its task id."""
        assert result.job_id == job_id
        if expected.code == "kept":
            assert (result.id, ms_of(result.eta)) == (expected.call.task_id, expected.due_ms), \
                f"if_exists='keep' did not return the stored job {job_id!r}"
        else:
            assert ms_of(result.eta) == expected.due_ms
            expected.call.task_id = result.id

    def due_now(self, job_id: str, before_ms: int) -> int:
        """The due time Redis gave a job made due now (run_now, recover, replay)."""
        after_ms = self.store.now_ms()
        job = self.delayq.get(job_id)
        assert job is not None and job.due is not None, f"{job_id!r} is not pending"
        due_ms = ms_of(job.due)
        assert before_ms <= due_ms <= after_ms
        return due_ms

    def pausing(self, call: Call) -> bool:
        """Whether a pause in force holds a due job of this call."""
        return bool({f"task:{call.task}", f"queue:{self.delayq.config.default_queue}"}
                    & self.paused)

    def home(self, job_id: str) -> int | None:
        """The shard of the job's envelope, if it has one."""
        stored = self.jobs[job_id].stored
        return None if stored is None else self.store.keys.shard_for(job_id, stored.key).shard

    def end_lease(self, held: Held) -> bool:
        """Ack, release and dead act on the lease of their claim alone: whether it held."""
        leases = self.jobs[held.claim.job_id].leases
        lease = leases.get(held.shard.shard)
        if lease is None or lease.token != held.claim.lease:
            return False
        del leases[held.shard.shard]
        return True

    def cancel_pending(self, job_id: str) -> None:
        """A cancelled pending copy is gone; where a carrier holds an earlier copy on its
        shard, that copy's call is what the store keeps (for its ack, recover or dead)."""
        job = self.jobs[job_id]
        lease = job.leases.get(self.home(job_id))
        job.due_ms = None
        job.unhold()
        job.stored = lease.call if lease else None

    def give_back(self, job_id: str, before_ms: int) -> None:
        """A lease ended by recover / release where the envelope is: the job is due now
        unless it is pending."""
        job = self.jobs[job_id]
        if job.due_ms is None:
            job.due_ms = self.due_now(job_id, before_ms)

    # -- producer side -----------------------------------------------------------------

    @rule(job_id=ids, key=keys, task=tasks, due=st.booleans(),
          if_exists=st.sampled_from(["keep", "replace", "error"]))
    def schedule(self, job_id, key, task, due, if_exists) -> None:
        eta = self.eta(due)
        expected = self.expect_schedule(job_id, Call(task, key, [self.seq]), ms_of(eta),
                                        if_exists)
        if expected.code == "conflict":
            with pytest.raises(JobExists):
                self.delayq.schedule(task, [self.seq], eta=eta, key=key, job_id=job_id,
                                     if_exists=if_exists)
            return
        result = self.delayq.schedule(task, [self.seq], eta=eta, key=key, job_id=job_id,
                                      if_exists=if_exists)
        self.check_result(result, expected, job_id)

    @rule(items=st.lists(st.tuples(ids, keys, st.booleans()), min_size=1, max_size=5),
          task=tasks, if_exists=st.sampled_from(["keep", "replace"]))
    def schedule_many(self, items, task, if_exists) -> None:
        homes: dict[str, set] = {}
        for job_id, key, _ in items:
            homes.setdefault(job_id, set()).add(self.store.keys.shard_for(job_id, key).shard)
        if any(len(shards) > 1 for shards in homes.values()):  # refused, nothing written
            with pytest.raises(InvalidOption):
                self.delayq.schedule_many(task, [
                    {"eta": self.eta(due), "key": key, "job_id": job_id}
                    for job_id, key, due in items], if_exists=if_exists)
            return
        calls, expected = [], []
        for job_id, key, due in items:
            eta = self.eta(due)
            calls.append({"args": [self.seq], "eta": eta, "key": key, "job_id": job_id})
            expected.append(self.expect_schedule(job_id, Call(task, key, [self.seq]), ms_of(eta),
                                                 if_exists))
        results = self.delayq.schedule_many(task, calls, if_exists=if_exists)
        for result, want, (job_id, _, _) in zip(results, expected, items, strict=True):
            self.check_result(result, want, job_id)

    @rule(job_id=ids, by_key=st.booleans())
    def cancel(self, job_id, by_key) -> None:
        job = self.jobs[job_id]
        key = job.stored.key if by_key and job.stored else None
        outcome = self.delayq.cancel_outcome(job_id, key)
        if job.due_ms is not None:
            # True means nothing of that id runs: not so while a carrier holds a copy (the
            # job was replaced in flight); the pending replacement is cancelled all the same
            assert outcome is (CancelOutcome.TOO_LATE if job.leases else
                               CancelOutcome.CANCELLED)
            self.cancelled += 1
            self.cancel_pending(job_id)
        elif job.leases:
            assert outcome is CancelOutcome.TOO_LATE
        else:
            assert outcome is CancelOutcome.UNKNOWN

    # Two rules aimed at ids a carrier holds (random ids meet them too rarely): scheduled
    # again, the old copy's envelope is kept for its lease; cancelled, the call it holds is
    # what stays (keys.py, invariant 8).
    @precondition(holding)
    @rule(pick=st.integers(0, 50), same_key=st.booleans(), key=keys, task=tasks,
          due=st.booleans())
    def replace_held(self, pick, same_key, key, task, due) -> None:
        held = self.held[pick % len(self.held)]
        self.schedule(held.claim.job_id, held.call.key if same_key else key, task, due,
                      "replace")

    @precondition(holding)
    @rule(pick=st.integers(0, 50), by_key=st.booleans())
    def cancel_held(self, pick, by_key) -> None:
        self.cancel(self.held[pick % len(self.held)].claim.job_id, by_key)

    @rule(key=st.sampled_from(KEYS[1:]))
    def cancel_key(self, key) -> None:
        pending = [job_id for job_id, job in self.jobs.items()
                   if job.due_ms is not None and job.stored.key == key]
        assert self.delayq.cancel_key(key) == len(pending)
        for job_id in pending:
            self.cancel_pending(job_id)
        self.cancelled += len(pending)

    @rule(job_id=ids, due=st.booleans())
    def reschedule(self, job_id, due) -> None:
        eta = self.eta(due)
        job = self.jobs[job_id]
        new_due = self.delayq.reschedule(job_id, eta=eta)
        if job.due_ms is None:
            assert new_due is None
        else:
            assert new_due == eta
            job.due_ms = ms_of(eta)
            job.unhold()

    @rule(job_id=ids)
    def run_now(self, job_id) -> None:
        before_ms = self.store.now_ms()
        job = self.jobs[job_id]
        assert self.delayq.run_now(job_id) is (job.due_ms is not None)
        if job.due_ms is not None:
            job.due_ms = self.due_now(job_id, before_ms)
            job.unhold()

    # -- pausing -----------------------------------------------------------------------

    @rule(what=pauses)
    def pause(self, what) -> None:
        kind, name = what
        name = name or self.delayq.config.default_queue
        self.delayq.pause(**{kind: name}, by="model")
        self.paused.add(f"{kind}:{name}")

    @rule(what=pauses)
    def resume(self, what) -> None:
        """Every held job no pause in force holds any more is due again."""
        kind, name = what
        name = name or self.delayq.config.default_queue
        self.paused.discard(f"{kind}:{name}")
        assert self.delayq.resume(**{kind: name}, by="model") == len(self.freed())
        for job in self.freed():
            job.unhold()

    @precondition(holding_due_jobs)
    @rule(what=pauses)
    def resume_cut_short(self, what) -> None:
        """A resume whose caller stopped as the pause ended (Ctrl-C, a web request killed
        by its server's timeout): the jobs no pause holds stay held until a carrier goes
        on with it."""
        kind, name = what
        name = name or self.delayq.config.default_queue
        self.paused.discard(f"{kind}:{name}")
        with mock.patch.object(Releasing, "release_held", side_effect=KeyboardInterrupt), \
                pytest.raises(KeyboardInterrupt):
            self.delayq.resume(**{kind: name}, by="model")
        for job in self.freed():
            job.stranded = True

    @precondition(stranding)
    @rule()
    def carrier_goes_on(self) -> None:
        """A carrier's maintenance, once the releases have stood still long enough."""
        with mock.patch.object(releasing, "RELEASE_STALE_MS", 0):
            walks = self.store.stalled_releases(list(self.store.keys), set())
        assert self.store.release_held(walks).released == len(self.freed())
        for job in self.freed():
            job.unhold()

    def freed(self) -> list[Model]:
        """The held jobs no pause in force holds: a resume gives them back."""
        return [job for job in self.jobs.values() if job.held and not self.pausing(job.stored)]

    # -- carrier side ------------------------------------------------------------------

    @rule(long_lease=st.booleans())
    def claim(self, long_lease) -> None:
        now_ms = self.store.now_ms()
        claims = self.store.claim(list(self.store.keys), BATCH,
                                  LONG_LEASE_MS if long_lease else 0)
        assert [c.error for c in claims if c.error] == []
        due = {job_id for job_id, job in self.jobs.items()
               if job.due_ms is not None and job.due_ms <= now_ms}
        for job_id in due:
            job = self.jobs[job_id]
            job.held = job.stranded or self.pausing(job.stored)
        due = {job_id for job_id in due if not self.jobs[job_id].held}
        claimed = [(c.shard, job) for c in claims for job in c.jobs]
        assert sorted(job.job_id for _, job in claimed) == sorted(due)
        for shard, claimed_job in claimed:
            job = self.jobs[claimed_job.job_id]
            fields = decoding.decode(claimed_job.envelope)
            call = Call(fields["t"], fields.get("y"), fields["a"],
                        fields.get("i", claimed_job.job_id))
            assert (call, claimed_job.due_ms) == (job.stored, job.due_ms)
            job.due_ms = None
            job.leases[shard.shard] = Lease(claimed_job.lease, not long_lease, call)
            self.held.append(Held(claimed_job, shard, call))

    @precondition(holding)
    @rule(pick=st.integers(0, 50))
    def ack(self, pick) -> None:
        """The carrier published a claimed job; ack it as the carrier does."""
        held = self.held.pop(pick % len(self.held))
        job_id = held.claim.job_id
        self.store.ack({held.shard: [Promoted(job_id, held.call.task, held.call.key,
                                              held.claim.due_ms, held.claim.stored_id,
                                              held.claim.lease)]})
        job = self.jobs[job_id]
        if self.end_lease(held) and self.home(job_id) == held.shard.shard \
                and job.due_ms is None:
            job.stored = None

    @precondition(leases_expired)
    @rule()
    def recover(self) -> None:
        """Expired leases end; where the envelope is, the job is due again."""
        before_ms = self.store.now_ms()
        expired = [(job_id, shard) for job_id, job in self.jobs.items()
                   for shard, lease in job.leases.items() if lease.expired]
        back = [job_id for job_id, shard in expired if self.home(job_id) == shard]
        recovered, failed = self.store.recover(list(self.store.keys), BATCH)
        assert (recovered, failed) == (len(back), {})
        for job_id, shard in expired:
            del self.jobs[job_id].leases[shard]
        for job_id in back:
            self.give_back(job_id, before_ms)

    @precondition(holding)
    @rule(pick=st.integers(0, 50))
    def release(self, pick) -> None:
        """The carrier could not publish: it gives the claim back at once."""
        held = self.held.pop(pick % len(self.held))
        job_id = held.claim.job_id
        before_ms = self.store.now_ms()
        released = self.store.release([ShardClaim(held.shard, before_ms, None, [held.claim],
                                                  [])])
        back = self.end_lease(held) and self.home(job_id) == held.shard.shard
        assert released == int(back)
        if back:
            self.give_back(job_id, before_ms)

    @precondition(holding)
    @rule(pick=st.integers(0, 50))
    def dead_letter(self, pick) -> None:
        """The carrier cannot publish a claimed job: it dead-letters that copy alone."""
        held = self.held.pop(pick % len(self.held))
        job_id = held.claim.job_id
        job = self.jobs[job_id]
        ours = self.end_lease(held)
        assert self.store.dead_letter(held.shard, held.claim, "fuzzed reason") is ours
        # else superseded (pending again, or moved to another shard): the new copy stays
        if ours and self.home(job_id) == held.shard.shard and job.due_ms is None:
            job.dead, job.stored = job.stored, None

    @rule(job_id=ids, key=keys, task=tasks)
    def bury(self, job_id, key, task) -> None:
        """A worker out of retries dead-letters a call of this id (one the store no longer
        holds; its id may have been scheduled again): the id's only dead letter."""
        self.scheduled.add(job_id)
        call = envelope.template(self.delayq.app, task, {}, self.delayq.store.keys).call(
            [self.seq], None, job_id=job_id, key=key, max_payload_bytes=4096, max_nesting=64)
        self.store.bury(job_id, key, call.envelope, "out of retries")
        self.jobs[job_id].dead = Call(task, key, [self.seq], call.task_id)

    @rule(job_id=ids)
    def replay(self, job_id) -> None:
        job = self.jobs[job_id]
        before_ms = self.store.now_ms()
        if job.dead is not None and job.stored is not None:
            with pytest.raises(JobExists):
                self.store.replay(job_id)
            return
        assert self.store.replay(job_id) is (job.dead is not None)
        if job.dead is not None:
            job.stored, job.dead = job.dead, None
            job.due_ms = self.due_now(job_id, before_ms)

    # -- agreement ---------------------------------------------------------------------

    def pending_model(self, key=None, task=None) -> list[tuple[int, str, tuple]]:
        return sorted((job.due_ms, job_id, astuple(job.stored))
                      for job_id, job in self.jobs.items()
                      if job.due_ms is not None and (key is None or job.stored.key == key)
                      and (task is None or job.stored.task == task))

    def assert_pending(self, listed, want) -> None:
        got = [(ms_of(j.due), j.job_id, (j.task, j.key, j.args, j.task_id)) for j in listed]
        assert [due for due, _, _ in got] == sorted(due for due, _, _ in got), "not in due order"
        assert sorted(got) == want

    @staticmethod
    def assert_first_due(listed, want, limit: int) -> None:
        """A listing cut by ``limit`` holds the earliest due jobs, held ones included."""
        assert [ms_of(j.due) for j in listed] == [due for due, _, _ in want[:limit]]

    @invariant()
    def jobs_agree(self) -> None:
        for job_id in sorted(self.scheduled):
            model, job = self.jobs[job_id], self.delayq.get(job_id)
            if model.stored is not None:
                assert job is not None, f"{job_id!r} is missing"
                state = "scheduled" if model.due_ms is not None else "claimed"
                assert (job.job_id, job.state, Call(job.task, job.key, job.args, job.task_id),
                        ms_of(job.due), job.paused) == (job_id, state, model.stored,
                                                        model.due_ms, model.held)
                if model.stored.key:
                    assert self.delayq.get(job_id, key=model.stored.key) == job
            elif model.dead is not None:
                assert job is not None and job.state == "dead", f"{job_id!r} is not dead"
                assert (job.task, job.key) == (model.dead.task, model.dead.key)
            else:
                assert job is None, f"{job_id!r} should be gone, found {job}"

    @invariant()
    def listings_agree(self) -> None:
        self.assert_pending(self.delayq.pending(limit=BATCH), self.pending_model())
        self.assert_first_due(self.delayq.pending(limit=3), self.pending_model(), 3)
        for key in sorted(self.keys_used):
            self.assert_pending(self.delayq.pending(key=key, limit=BATCH),
                                self.pending_model(key=key))
            self.assert_first_due(self.delayq.pending(key=key, limit=2),
                                  self.pending_model(key=key), 2)
        for task in sorted(self.tasks_used):
            self.assert_pending(self.delayq.pending(task=task, limit=BATCH),
                                self.pending_model(task=task))
        dead = {entry["job_id"]: entry for entry in self.store.dead(limit=BATCH)}
        assert dead.keys() == {job_id for job_id, job in self.jobs.items() if job.dead}
        for job_id, entry in dead.items():
            fields = decoding.decode(entry["envelope"])
            assert (fields["t"], fields.get("y")) == (self.jobs[job_id].dead.task,
                                                      self.jobs[job_id].dead.key)

    @invariant()
    def totals_agree(self) -> None:
        now_ms = self.store.now_ms()
        rows = self.store.stats()
        models = self.jobs.values()
        assert sum(r["pending"] for r in rows) == sum(j.due_ms is not None for j in models)
        assert sum(r["overdue"] for r in rows) == sum(
            j.due_ms is not None and j.due_ms <= now_ms and not j.held for j in models)
        assert sum(r["paused"] for r in rows) == sum(j.held for j in models)
        assert sum(r["inflight"] for r in rows) == sum(len(j.leases) for j in models)
        assert sum(r["dead"] for r in rows) == sum(j.dead is not None for j in models)
        tasks = Counter(j.stored.task for j in models if j.stored is not None)
        assert self.store.counts() == (dict(tasks), self.cancelled)


def test_store_agrees_with_its_model_after_every_step(delayq):
    """About 15 s when it passes. A failure is shrunk to a short sequence of calls, printed
    as ``state.<rule>(...)`` lines; one failure at a time, so shrinking stays well within
    the test timeout."""
    run_state_machine_as_test(
        lambda: StoreMachine(delayq),
        settings=settings(max_examples=examples(60),
                          stateful_step_count=20 if FUZZ_SCALE == 1 else 50, deadline=None,
                          report_multiple_bugs=False))
