"""The Redis delay store: every read and write of the keys named in :mod:`keys`.

Writes go through the Lua scripts in ``scripts/``, one atomic call per shard; reads are
plain commands, pipelined across shards.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from enum import Enum
from functools import cached_property
from typing import Any, NamedTuple, cast

import redis
from redis.client import PubSub
from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError

from .conf import DelayQConfig
from .connection import connect, redact
from .envelope import Call, Job, canonical_json
from .errors import (
    ConfigurationError,
    DamagedShard,
    DelayQError,
    InvalidOption,
    JobExists,
    StoreFull,
    StoreUnavailable,
)
from .held import NOT_HELD, RANGES, split_score
from .keys import KEY_TYPES, Keyspace, ShardKeys, bykey_member, pack_id, raw_id, unpack_id
from .memory import Headroom, Memory
from .reading import MAX_MS, MIN_MS, Unreadable, datetime_of_ms, is_text, job_id_of, printable
from .reservation import Reservation, reserving
from .scripts import SCRIPTS, Deferred, Script, execute
from .validation import Due

_logger = logging.getLogger(__name__)
_NETWORK_ERRORS = (redis.ConnectionError, redis.TimeoutError, ClusterDownError)
_SCAN_CHUNK = 500
_SCHEDULE_CHUNK = 1000  # jobs per schedule script call
_DAMAGED = "DAMAGED "  # how a script's error says one of its keys holds the wrong type
#: How long a run's outcome (``RunRows``) is kept after its last write, unless forgotten.
OUTCOME_MS = 24 * 3600 * 1000
#: How long a job's task id index (keys.py) outlives its due time: a job pending that much
#: past due (no carrier running) is no longer found by its task id, only by its job id.
TASK_INDEX_GRACE_MS = 24 * 3600 * 1000


class CancelOutcome(str, Enum):
    """What a cancel by job id found."""

    CANCELLED = "cancelled"
    TOO_LATE = "too late: already promoted"
    UNKNOWN = "unknown"


class ScheduleCode(int, Enum):
    """What the schedule script did with one job."""

    CREATED = 1
    REPLACED = 2
    KEPT = 0  # if_exists="keep": the stored job is left as it was
    CONFLICT = -1  # if_exists="error": nothing written
    DUPLICATE = -2  # another input row of the run (RunRows) has this job id: nothing written


class RunRows(NamedTuple):
    """The items of a schedule call as input rows of one run (a Spark job)."""

    run: str  # unique per run
    names: list[str]  # one per item, unique in the run and the same when it is made again


_CODES = {code.value: code for code in ScheduleCode}  # a dict lookup costs less than a call


@dataclass(frozen=True)
class Scheduled:
    """The store's answer for one scheduled call."""

    code: ScheduleCode
    due_ms: int  # -1 when a kept job is not pending (being promoted)
    existing: str | None  # the stored envelope when the job was kept


class Claimed(NamedTuple):
    """A due job leased to a carrier, which publishes it and then acks it."""

    job_id: str
    due_ms: int | None  # None: the stored due time is not a finite number (damaged)
    envelope: str | None
    stored_id: str  # the job id as stored (keys.pack_id)
    lease: str  # its in-flight score as claim_due wrote it: ack, release, dead check it


class Promoted(NamedTuple):
    """A claimed job that reached the broker, as ``ack`` journals it."""

    job_id: str
    task: str
    key: str | None
    due_ms: int
    stored_id: str = ""  # the job id as stored (keys.pack_id); worked out when not given
    lease: str = ""  # Claimed.lease; "" acks whatever lease holds the job


@dataclass(frozen=True)
class ShardClaim:
    shard: ShardKeys
    now_ms: int
    next_due_ms: int | None
    jobs: list[Claimed]  # claimed: the carrier publishes them, then acks
    promoted: list[int]  # due ms of the jobs the claim script pushed to the broker itself
    error: DelayQError | None = None  # the shard's claim failed (e.g. DamagedShard)


@dataclass(frozen=True)
class DirectRoutes:
    """The broker queues the claim script may push plain jobs to (direct promotion)."""

    lists: list[str]  # the broker's list of each queue
    queues: list[tuple[str, int]]  # (queue name, delivery mode) of each list
    origin: str  # the origin header
    repr_max: int  # longest argsrepr / kwargsrepr header


class ClaimAhead:
    """A claim sent by :meth:`Store.claim_ahead` whose reply is not read yet."""

    def __init__(self, store: Store, shards: list[ShardKeys], sent: Deferred, acks: int,
                 sent_at: float) -> None:
        self.store, self.shards, self._sent, self._acks = store, shards, sent, acks
        self.sent_at = sent_at  # time.monotonic() when sent: about when Redis ran it

    def result(self) -> list[ShardClaim]:
        """The claims (a shard's failure in its claim's ``error``); raises if an ack sent
        with them failed, or Redis did. Call once."""
        with self.store.unavailable():
            replies = self._sent.replies(raise_errors=False)
            for reply in replies[:self._acks]:
                if isinstance(reply, Exception):
                    raise reply
        return _shard_claims(self.shards, replies[self._acks:])


@dataclass(frozen=True)
class _Wanted:
    """The filters of ``Store.pending`` on a job it has read."""

    task: str | None
    args_contains: str | None  # canonical JSON of one argument value

    def matches(self, job: Job) -> bool:
        if self.task is not None and job.task != self.task:
            return False
        if self.args_contains is None:
            return True
        return any(_canonical(value) == self.args_contains
                   for value in (*job.args, *job.kwargs.values()))


def _canonical(value: Any) -> str | None:
    """A stored argument value as canonical JSON; None for one JSON has no text for (NaN
    or Infinity planted by hand: producers refuse them)."""
    try:
        return canonical_json(value)
    except (TypeError, ValueError):
        return None


class Store:
    """The delay store of one app (see :mod:`keys` for the data layout)."""

    def __init__(self, config: DelayQConfig) -> None:
        self.config = config
        self.keys = Keyspace(config.prefix, config.shards)
        self._maxlen = config.journal_maxlen

    # -- connection --------------------------------------------------------------------

    @cached_property
    def client(self) -> redis.Redis | RedisCluster:
        """A client of the store (plain, cluster or Sentinel: see :mod:`connection`)."""
        with self.unavailable():
            client = connect(self.config)
            self._check_shard_count(client)
        return client

    def _check_shard_count(self, client: redis.Redis | RedisCluster) -> None:
        """Refuse a shard count other than the store's; a read unless the store is new, so
        a full Redis does not stop a start (the first write records it then)."""
        stored = client.hget(self.keys.meta, "shards")
        if stored is None:
            try:
                client.hsetnx(self.keys.meta, "shards", self.keys.shards)
            except redis.ResponseError as exc:
                if not _refused_for_memory(exc):
                    raise
                return
            stored = client.hget(self.keys.meta, "shards")
        if stored is not None and int(stored) != self.keys.shards:
            raise ConfigurationError(
                f"the store under prefix {self.keys.prefix!r} was created with "
                f"delayq_shards={int(stored)}, this app says {self.keys.shards}; use the same "
                "value (or a new delayq_prefix) so every job can be found"
            )

    @contextlib.contextmanager
    def unavailable(self) -> Iterator[None]:
        """Turn Redis network errors into :class:`StoreUnavailable` with a safe URL, and a
        write refused for memory into :class:`StoreFull`."""
        try:
            yield
        except _NETWORK_ERRORS as exc:
            raise StoreUnavailable(
                f"Redis at {redact(self.config.redis_url)} is unavailable after "
                f"{self.config.redis_retries} retries ({exc}); check that it runs and that "
                "delayq_redis_url points at it"
            ) from exc
        except redis.ResponseError as exc:
            if str(exc).startswith(_DAMAGED):
                raise DamagedShard(str(exc)) from exc
            if str(exc).startswith("DB index is out of range"):
                raise ConfigurationError(
                    f"Redis at {redact(self.config.redis_url)} has no such database (the "
                    "number after the last /): its `databases` setting is lower; give "
                    "delayq_redis_url (or the broker URL) a database below it, such as /0"
                ) from exc
            if _refused_for_memory(exc):
                self.headroom.refused()
                raise StoreFull(f"Redis at {redact(self.config.redis_url)} refused a write: "
                                "it is at its maxmemory") from exc
            raise

    def now_ms(self) -> int:
        """Redis's clock, in ms: the clock every due time follows."""
        seconds, micros = self.client.time()
        return seconds * 1000 + micros // 1000

    def pubsub(self) -> PubSub:
        return self.client.pubsub(ignore_subscribe_messages=True)

    def close(self) -> None:
        if "client" in self.__dict__:
            self.client.close()
            del self.__dict__["client"]

    # -- producer side -----------------------------------------------------------------

    def schedule(self, items: list[tuple[Call, Due]], if_exists: str,
                 rows: RunRows | None = None) -> list[Scheduled]:
        """Store calls: one script call per shard and batch, in one round trip.

        ``rows`` names the items as input rows of a run: a row is written at most once in
        the run, however often its call is made again (a retried Spark task, a recomputed
        partition), which then answers the first outcome (due ms -1).

        A job id is one job whatever its business key, so a call that brings an id of its
        own first looks for it on the other shards (one more round trip), holding a
        reservation of it until its write is done (:mod:`reservation`): ``if_exists``
        applies to a copy found there, and ``replace`` moves the job to its new shard.
        """
        with self.unavailable():
            self.headroom.check(sum(len(call.envelope) for call, _ in items))
        with reserving(self.client, self.keys, [call for call, _ in items]) as reservation:
            return self._schedule(items, if_exists, reservation, rows)

    def _schedule(self, items: list[tuple[Call, Due]], if_exists: str,
                  reservation: Reservation, rows: RunRows | None) -> list[Scheduled]:
        results: list[Scheduled | None] = [None] * len(items)
        moved: dict[int, ShardKeys] = {}  # replaced under a key of another shard
        for index, found in self._stored_elsewhere(items, reservation).items():
            if if_exists == "replace":
                moved[index] = found
            else:  # None when it went meanwhile (promoted): then it is scheduled here
                results[index] = self._existing(found, items[index][0], if_exists)
        by_shard: dict[ShardKeys, list[int]] = defaultdict(list)
        for index, (call, _) in enumerate(items):
            if results[index] is None:
                by_shard[self.keys.shard_for(call.job_id, call.key)].append(index)
        calls, owners = [], []
        for shard, indexes in by_shard.items():
            for start in range(0, len(indexes), _SCHEDULE_CHUNK):
                chunk = indexes[start:start + _SCHEDULE_CHUNK]
                keys = [shard.due, shard.jobs, shard.bykey, shard.journal, shard.counts]
                if rows is not None:
                    keys.append(self.keys.outcome(shard, rows.run))
                args: list[Any] = [if_exists, self.keys.wake_channel, shard.shard, self._maxlen,
                                   OUTCOME_MS if rows is not None else 0, TASK_INDEX_GRACE_MS]
                for index in chunk:
                    call, due = items[index]
                    task_index = 0
                    if call.task_id != call.job_id:
                        keys.append(self.keys.task_index(shard, pack_id(call.task_id)))
                        task_index = len(keys)
                    args += [call.stored_id, call.envelope, *due.script_args(),
                             bykey_member(call.key, call.stored_id), call.task, call.key or "",
                             task_index]
                    if rows is not None:
                        args.append(rows.names[index])
                calls.append((SCRIPTS["schedule"], keys, args))
                owners.append(chunk)
        with self.unavailable():  # a job moved from another shard leaves it before the release
            replies = reservation.run(calls) if moved else reservation.release_after(calls)
        failed = next((reply for reply in replies if isinstance(reply, Exception)), None)
        if failed is not None:
            self._refuse(failed, [items[index][0].job_id
                                  for chunk, reply in zip(owners, replies, strict=True)
                                  if not isinstance(reply, Exception)
                                  for offset, index in enumerate(chunk)
                                  if reply[3 * offset] in (1, 2)])
        for chunk, reply in zip(owners, replies, strict=True):
            for offset, index in enumerate(chunk):
                code, score, existing = reply[3 * offset:3 * offset + 3]
                due_ms = cast("float", split_score(score)[0])  # a number: -1 when none
                results[index] = Scheduled(_CODES[code], int(due_ms), existing)
        for index, found in moved.items():  # the new copy is stored: the old one goes
            self._cancel(found, "move", items[index][0].job_id, "replaced under another key")
        return cast("list[Scheduled]", results)  # every item has its outcome now

    def forget_run(self, run: str) -> None:
        """Drop a finished run's outcome (``RunRows``); it would expire by itself."""
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            for shard in self.keys:
                pipe.delete(self.keys.outcome(shard, run))
            pipe.execute()

    def _stored_elsewhere(self, items: list[tuple[Call, Due]], reservation: Reservation
                          ) -> dict[int, ShardKeys]:
        """For each call with a job id of its own: the shard other than its own that holds
        that id (stored under another business key). One ``exists`` call per shard, once
        the reservations are taken."""
        homes: dict[str, ShardKeys] = {}
        looked_for: dict[ShardKeys, list[int]] = defaultdict(list)  # shard -> item indexes
        for index, (call, _) in enumerate(items):
            if call.drawn:  # a fresh random id: no other job has it
                continue
            home = self.keys.shard_for(call.job_id, call.key)
            if homes.setdefault(call.stored_id, home) is not home:
                raise InvalidOption(
                    f"job id {call.job_id!r} is given twice in one batch with business keys "
                    "of different shards; one job id is one job: give each its own id")
            for shard in self.keys:
                if shard is not home:
                    looked_for[shard].append(index)
        calls, owners = [], []
        for shard, indexes in looked_for.items():
            for start in range(0, len(indexes), _SCHEDULE_CHUNK):
                chunk = indexes[start:start + _SCHEDULE_CHUNK]
                calls.append((SCRIPTS["exists"], [shard.jobs],
                              [items[index][0].stored_id for index in chunk]))
                owners.append((shard, chunk))
        if not calls:
            return {}
        with self.unavailable():
            replies = reservation.take_then(calls)
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        elsewhere: dict[int, ShardKeys] = {}
        for (shard, chunk), found in zip(owners, replies, strict=True):
            for index, hit in zip(chunk, found, strict=True):
                if hit == "1":
                    elsewhere.setdefault(index, shard)
        return elsewhere

    def _existing(self, shard: ShardKeys, call: Call, if_exists: str) -> Scheduled | None:
        """What ``keep`` / ``error`` answer for a job stored on another shard; None when it
        is gone."""
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            pipe.hget(shard.jobs, call.stored_id)
            pipe.zscore(shard.due, call.stored_id)
            envelope, score = pipe.execute()
        if envelope is None:
            return None
        code = ScheduleCode.KEPT if if_exists == "keep" else ScheduleCode.CONFLICT
        due_ms = split_score(score)[0]
        return Scheduled(code, -1 if due_ms is None else int(due_ms), envelope)

    def _refuse(self, failed: Exception, stored: list[str]) -> None:
        """Raise a failed schedule call's error; each call is atomic (a script refused for
        memory wrote nothing), so ``stored`` (written by the calls that ran) is exact."""
        if isinstance(failed, redis.ResponseError) and _refused_for_memory(failed):
            self.headroom.refused()
            raise StoreFull(f"Redis at {redact(self.config.redis_url)} refused a write: it is "
                            "at its maxmemory", stored) from failed
        with self.unavailable():
            raise failed

    def cancel(self, job_id: str, key: str | None = None, by: str = "",
               task_id: str = "") -> CancelOutcome:
        """Cancel a pending job; the outcome says whether anything of that id will run.

        A job id names one job whatever its business key: a copy stored under another
        key (two producers racing with different keys) is cancelled as well. With
        ``task_id``, only a job of that Celery task id is cancelled.
        """
        home = self.keys.shard_for(job_id, key)
        codes = {self._cancel(home, "id", job_id, by, task_id)[0]}
        codes |= {self._cancel(shard, "id", job_id, by, task_id)[0]
                  for shard in self._shards_holding(job_id, in_flight=True)
                  if shard is not home}
        if 0 in codes:  # a carrier holds a copy: it will be delivered
            return CancelOutcome.TOO_LATE
        return CancelOutcome.CANCELLED if 1 in codes else CancelOutcome.UNKNOWN

    def cancel_key(self, key: str, by: str = "") -> list[str]:
        """Cancel every pending job with this business key; returns their task ids."""
        reply = self._cancel(self.keys.shard_for("", key), "key", key, by)
        return [task_id or unpack_id(job_id) for task_id, job_id in zip(
            reply[2::2], reply[3::2], strict=True)]

    def cancel_task(self, task_id: str, by: str = "") -> CancelOutcome:
        """Cancel the pending job of a Celery task id: the job of that id, else the job
        its task id index names (a job scheduled with an id of its own)."""
        outcome = self.cancel(task_id, by=by)
        if outcome is not CancelOutcome.UNKNOWN:
            return outcome
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            for shard in self.keys:
                pipe.get(self.keys.task_index(shard, pack_id(task_id)))
            job_ids = {unpack_id(stored) for stored in pipe.execute() if stored is not None}
        for job_id in job_ids:  # one, unless its job moved to another key's shard
            outcome = self.cancel(job_id, by=by, task_id=task_id)
            if outcome is not CancelOutcome.UNKNOWN:
                return outcome
        return CancelOutcome.UNKNOWN

    def _cancel(self, shard: ShardKeys, kind: str, value: str, by: str,
                task_id: str = "") -> list[Any]:
        with self.unavailable():
            return SCRIPTS["cancel"].call(
                self.client,
                [shard.due, shard.jobs, shard.inflight, shard.bykey, shard.journal,
                 shard.counts],
                [kind, value if kind == "key" else pack_id(value), self._maxlen, by, task_id])

    def reschedule(self, job_id: str, due: Due, key: str | None = None) -> int | None:
        """Move a pending job to a new due time; returns it (ms) or None if not pending."""
        for shard in self._candidates(job_id, key):
            with self.unavailable():
                ok, due_ms, task_id = SCRIPTS["reschedule"].call(
                    self.client, [shard.due, shard.jobs, shard.journal],
                    [pack_id(job_id), *due.script_args(), self.keys.wake_channel, shard.shard,
                     self._maxlen])
                if ok and task_id:  # its task id index lives as long as it is pending
                    self.client.pexpireat(self.keys.task_index(shard, pack_id(task_id)),
                                          due_ms + TASK_INDEX_GRACE_MS)
            if ok:
                return due_ms
        return None

    # -- reads -------------------------------------------------------------------------

    def _candidates(self, job_id: str, key: str | None) -> list[ShardKeys]:
        if key is not None:
            return [self.keys.shard_for(job_id, key)]
        return self._shards_holding(job_id)

    def _shards_holding(self, job_id: str, in_flight: bool = False) -> list[ShardKeys]:
        """Shards whose job hash holds ``job_id`` (with ``in_flight``: or whose carrier
        holds a copy of it, moved to another shard meanwhile), the id's own shard first."""
        own = self.keys.shard_for(job_id)
        order = [own, *(s for s in self.keys if s is not own)]
        stored = pack_id(job_id)
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            for shard in order:
                pipe.hexists(shard.jobs, stored)
                if in_flight:
                    pipe.zscore(shard.inflight, stored)  # a lease deadline, never 0
            found = pipe.execute()
        step = 2 if in_flight else 1
        return [shard for n, shard in enumerate(order) if any(found[n * step:(n + 1) * step])]

    def get(self, job_id: str, key: str | None = None) -> Job | None:
        """The stored job: pending (``scheduled``), else being promoted (``claimed``: a job
        moved to another key while in flight has both), else ``dead``."""
        shards = [self.keys.shard_for(job_id, key)] if key else list(self.keys)
        stored = pack_id(job_id)
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            for shard in shards:
                pipe.hget(shard.jobs, stored)
                pipe.zscore(shard.due, stored)
                pipe.hget(shard.dead, stored)
            flat = pipe.execute()
        replies = [tuple(flat[n:n + 3]) for n in range(0, len(flat), 3)]
        found = sorted((score is None, raw is None, n) for n, (raw, score, dead)
                       in enumerate(replies) if raw is not None or dead is not None)
        if not found:
            return None
        n = found[0][2]
        (raw, score, dead), shard = replies[n], shards[n]
        if raw is not None:
            return self._job(job_id, raw, score, "scheduled" if score is not None else "claimed",
                             shard)
        return Job.dead(job_id, _dead_letter(stored, dead, shard.shard)[0], shard.shard,
                        self.config.default_queue)

    def pending(self, task: str | None = None, key: str | None = None,
                limit: int = 100, args_contains: str | None = None) -> list[Job]:
        """Pending jobs in due order, optionally of one task and/or one business key, and
        with ``args_contains`` (canonical JSON, ``envelope.canonical_json``) only those
        called with that value as one of their positional or keyword argument values.

        Without a key this reads the due sets from their start until ``limit`` jobs match:
        a filter that matches few jobs reads the whole store. Jobs that cannot be read
        (:meth:`get` shows why) are left out, counted and logged once per call; the carrier
        dead-letters them when they fall due.
        """
        shards = [self.keys.shard_for("", key)] if key else list(self.keys)
        jobs: list[Job] = []
        skipped = Unreadable("pending jobs", _logger)
        wanted = _Wanted(task, args_contains)
        with self.unavailable():
            for shard in shards:
                jobs.extend(self._pending_in(shard, wanted, key, limit, skipped))
        skipped.log()
        jobs.sort(key=lambda job: job.due.timestamp() if job.due else math.inf)
        return jobs[:limit]

    def _pending_in(self, shard: ShardKeys, wanted: _Wanted, key: str | None,
                    limit: int, skipped: Unreadable) -> list[Job]:
        if key:
            members = cast("list[str]", self.client.zrangebylex(  # decode_responses
                shard.bykey, f"[{key}\x00", f"({key}\x01"))
            ids = [m.partition("\x00")[2] for m in members]
            pipe = self.client.pipeline(transaction=False)
            for stored in ids:
                pipe.zscore(shard.due, raw_id(stored))
            scored = [(i, s) for i, s in zip(ids, pipe.execute(), strict=True) if s is not None]
            return self._jobs_of(shard, scored, wanted, skipped)  # in id order: pending() sorts
        # each score range in due order, at most ``limit`` matches of each (pending()
        # merges them): the jobs held by a pause, by a rate limit (held.py), the others
        found: list[Job] = []
        ranges: list[tuple[float | str, float | str]] = [*RANGES.values(), *NOT_HELD]
        for low, high in ranges:
            matched: list[Job] = []
            start = 0
            while len(matched) < limit:
                chunk = cast("list[tuple[str, float]]", self.client.zrangebyscore(
                    shard.due, low, high, start=start, num=_SCAN_CHUNK, withscores=True))
                if not chunk:
                    break
                matched.extend(self._jobs_of(shard, chunk, wanted, skipped))
                start += _SCAN_CHUNK
            found += matched[:limit]
        return found

    def _jobs_of(self, shard: ShardKeys, scored: list[tuple[str, float]],
                 wanted: _Wanted, skipped: Unreadable) -> list[Job]:
        if not scored:
            return []
        raws = self.client.hmget(shard.jobs, [raw_id(stored) for stored, _ in scored])
        jobs = []
        for (stored, score), raw in zip(scored, raws, strict=True):
            job_id = job_id_of(stored)
            job = self._job(job_id or stored, raw, score, "scheduled", shard)
            if job_id is None or job.unreadable:
                skipped.add(f"job {stored!r} on shard {shard.shard}",
                            job.unreadable or "not a stored job id")
            elif wanted.matches(job):
                jobs.append(job)
        return jobs

    def _job(self, job_id: str, raw: Any, score: float | None, state: str,
             shard: ShardKeys) -> Job:
        """The job stored as ``raw`` with due score ``score`` (held or not)."""
        due_ms, held = split_score(score)
        job = Job.read(job_id, raw, due_ms, state, shard.shard, self.config.default_queue)
        return replace(job, held=held) if held else job

    def dead(self, limit: int = 100) -> list[dict[str, Any]]:
        """Dead-lettered jobs with their reason, newest first.

        Entries that cannot be read come last, with ``at`` None, a reason that starts
        "unreadable dead letter" and the stored text as ``envelope``; they are counted and
        logged once per call.
        """
        entries = []
        skipped = Unreadable("dead letters", _logger)
        with self.unavailable():
            for shard in self.keys:
                for stored, raw in self.client.hscan_iter(shard.dead, count=_SCAN_CHUNK):
                    entry, why = _dead_letter(stored, raw, shard.shard)
                    if why:
                        skipped.add(f"dead letter {stored!r} on shard {shard.shard}", why)
                    entries.append(entry)
        skipped.log()
        entries.sort(key=lambda e: (e["at"] is not None, e["at"] or 0), reverse=True)
        return entries[:limit]

    def replay(self, job_id: str, envelope: str = "") -> bool:
        """Put a dead-lettered job back, due now (optionally with a fixed envelope); False
        when no job of this id is dead, :class:`JobExists` when a live one has its id (on
        any shard)."""
        stored = pack_id(job_id)
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            for shard in self.keys:
                pipe.hexists(shard.dead, stored)
            dead = [shard for shard, hit in zip(self.keys, pipe.execute(), strict=True) if hit]
        if not dead:
            return False
        if self._shards_holding(job_id):
            raise JobExists(job_id)
        shard = dead[0]
        with self.unavailable():
            code = SCRIPTS["replay"].call(
                self.client,
                [shard.dead, shard.jobs, shard.due, shard.bykey, shard.journal, shard.counts],
                [stored, envelope, self._maxlen, self.keys.wake_channel, shard.shard])
        if code == -1:
            raise JobExists(job_id)
        return code == 1

    def stats(self) -> list[dict[str, Any]]:
        """Per-shard counts: pending, overdue, paused and rate_limited (due jobs held by a
        pause or by their queue's rate limit: pending, not overdue), in flight, dead,
        journal length, next due, and ``unreadable_due``: pending jobs whose due score is
        no time (±inf, after the year 9999), which ``next_due_ms`` passes over.
        ``damaged`` says which key of the shard holds the wrong type ("" when none); its
        counts are then 0.

        "Overdue" (due but not yet claimed) and ``now_ms`` follow Redis's clock.
        """
        with self.unavailable():
            now_ms = self.now_ms()
            pipe = self.client.pipeline(transaction=False)
            for shard in self.keys:
                pipe.zcard(shard.due)
                pipe.zcount(shard.due, "-inf", now_ms)
                pipe.zcard(shard.inflight)
                pipe.hlen(shard.dead)
                pipe.xlen(shard.journal)
                pipe.zcount(shard.due, MIN_MS, MAX_MS)
                self._head(pipe, shard)
                for low, high in RANGES.values():
                    pipe.zcount(shard.due, low, high)
            replies = pipe.execute(raise_on_error=False)
            damaged = self.damaged() if any(isinstance(r, Exception) for r in replies) else {}
        rows = []
        for shard in self.keys:
            shard_replies, replies = replies[:9], replies[9:]
            pending, overdue, inflight, dead, journal, readable, head, paused, limited = (
                (0, 0, 0, 0, 0, 0, [], 0, 0) if shard.shard in damaged else shard_replies)
            rows.append({
                "shard": shard.shard, "pending": pending, "overdue": overdue,
                "paused": paused, "rate_limited": limited, "inflight": inflight,
                "dead": dead, "journal": journal,
                "unreadable_due": pending - readable - paused - limited,
                "next_due_ms": int(head[0][1]) if head else None, "now_ms": now_ms,
                "damaged": damaged.get(shard.shard, ""),
            })
        return rows

    def earliest(self) -> tuple[int, str, ShardKeys] | None:
        """(due ms, job id, shard) of the first pending job whose due score is a time, or
        None."""
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            for shard in self.keys:
                self._head(pipe, shard)
            heads = [(int(head[0][1]), job_id_of(head[0][0]) or head[0][0], shard)
                     for shard, head in zip(self.keys, pipe.execute(raise_on_error=False),
                                            strict=True)
                     if head and not isinstance(head, Exception)]  # not a damaged shard
        return min(heads, key=lambda head: head[0], default=None)

    @staticmethod
    def _head(pipe, shard: ShardKeys) -> None:
        """Queue a read of the shard's first pending job whose due score is a time."""
        pipe.zrangebyscore(shard.due, MIN_MS, MAX_MS, start=0, num=1, withscores=True)

    def counts(self) -> tuple[dict[str, int], int]:
        """Jobs stored per task name (pending or being promoted), and cancels so far."""
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            for shard in self.keys:
                pipe.hgetall(shard.counts)
            per_shard = pipe.execute(raise_on_error=False)
        tasks: dict[str, int] = defaultdict(int)
        skipped = Unreadable("job counts", _logger)
        for shard, counts in zip(self.keys, per_shard, strict=True):
            if isinstance(counts, Exception):  # a damaged shard (stats() says which key)
                skipped.add(f"counts of shard {shard.shard}", str(counts))
                continue
            for task, n in counts.items():
                if is_text(task) and n.lstrip("-").isdecimal():
                    tasks[task] += int(n)
                else:
                    skipped.add(f"count {task!r} on shard {shard.shard}", f"holds {n!r}")
        skipped.log()
        cancelled = tasks.pop("", 0)
        return {task: n for task, n in tasks.items() if n}, cancelled

    # -- pausing -----------------------------------------------------------------------

    def pause(self, field: str, by: str) -> None:
        """Hold the due jobs of a task or queue (a ``pausing.field``) on every shard."""
        self._pause_script("pause", field, by)

    def resume(self, field: str, by: str) -> int:
        """End a pause on every shard; returns how many held jobs were given back."""
        return sum(self._pause_script("resume", field, by))

    def _pause_script(self, action: str, field: str, by: str) -> list[int]:
        return self._on_every_shard(
            SCRIPTS["pause"], lambda s: [s.paused, s.due, s.jobs, s.journal], [action, field, by])

    def set_rate_limit(self, queue: str, limit: str, by: str) -> int:
        """Set a queue's rate limit on every shard (``ratelimit.bucket``), or remove it with
        ``ratelimit.OFF``; returns how many held jobs a removal gave back."""
        return sum(self._on_every_shard(
            SCRIPTS["limit"], lambda s: [s.limits, s.due, s.jobs, s.journal, s.waiting],
            [queue, limit, by]))

    def rate_limits(self) -> dict[str, str]:
        """Queue -> its ``limits`` hash value on shard 0 (the same on every shard)."""
        with self.unavailable():
            found = cast("dict[str, str]", self.client.hgetall(self.keys.shard(0).limits))
        return {name.removeprefix("rate:"): value for name, value in found.items()
                if name.startswith("rate:")}

    def _on_every_shard(self, script: Script, keys: Callable[[ShardKeys], list[str]],
                        args: list[Any]) -> list[Any]:
        """Run a pause / limit script on every shard; it journals on shard 0 only."""
        calls = [(script, keys(s), [*args, self._maxlen if s.shard == 0 else 0,
                                    self.config.default_queue, self.keys.wake_channel,
                                    s.shard])
                 for s in self.keys]
        with self.unavailable():
            return execute(self.client, calls)

    def paused(self) -> set[str]:
        """The ``pausing.field`` of every pause (of any shard: one left by a pause that
        failed part way is listed too)."""
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            for shard in self.keys:
                pipe.hkeys(shard.paused)
            return {name for names in pipe.execute() for name in names}

    # -- carrier side ------------------------------------------------------------------

    def claim(self, shards: list[ShardKeys], batch: int, lease_ms: int,
              direct: DirectRoutes | None = None, lead_ms: int = 0) -> list[ShardClaim]:
        """Claim up to ``batch`` jobs due within ``lead_ms`` on each shard, in one round
        trip; with ``direct``, plain jobs for those queues are pushed to the broker by the
        script instead."""
        with self.unavailable():
            replies = execute(self.client,
                              self._claim_calls(shards, batch, lease_ms, direct, lead_ms),
                              raise_errors=False)
        return _shard_claims(shards, replies)

    def claim_ahead(self, shards: list[ShardKeys], batch: int, lease_ms: int,
                    direct: DirectRoutes | None = None,
                    acks: dict[ShardKeys, list[Promoted]] | None = None,
                    lead_ms: int = 0) -> ClaimAhead:
        """Send :meth:`ack` of ``acks`` and :meth:`claim` now, read the claims later: Redis
        runs both while the carrier publishes what it claimed before."""
        ack_calls = self._ack_calls(acks or {})
        with self.unavailable():
            sent = Deferred(self.client,
                            ack_calls + self._claim_calls(shards, batch, lease_ms, direct,
                                                          lead_ms))
        return ClaimAhead(self, shards, sent, len(ack_calls), time.monotonic())

    def _claim_calls(self, shards: list[ShardKeys], batch: int, lease_ms: int,
                     direct: DirectRoutes | None,
                     lead_ms: int) -> list[tuple[Script, list[str], list[Any]]]:
        lists, routes, origin, repr_max = [], [], "", 0
        if direct is not None:
            lists, routes = direct.lists, [value for route in direct.queues for value in route]
            origin, repr_max = direct.origin, direct.repr_max
        return [(SCRIPTS["claim_due"],
                 [s.due, s.inflight, s.jobs, s.bykey, s.journal, s.counts, s.paused, s.limits,
                  s.waiting, *lists],
                 [batch, lease_ms, self._maxlen, s.shard, origin, repr_max,
                  self.config.default_queue, self.config.max_nesting, lead_ms, *routes])
                for s in shards]

    def ack(self, acks: dict[ShardKeys, list[Promoted]]) -> None:
        """Forget jobs that reached the broker, per shard, and journal them as promoted."""
        calls = self._ack_calls(acks)
        if calls:
            with self.unavailable():
                execute(self.client, calls)

    def _ack_calls(self, acks: dict[ShardKeys, list[Promoted]]
                   ) -> list[tuple[Script, list[str], list[Any]]]:
        calls = []
        for shard, jobs in acks.items():
            args: list[Any] = [self._maxlen]
            for job in jobs:
                stored = job.stored_id or pack_id(job.job_id)
                args += [raw_id(stored), raw_id(bykey_member(job.key, stored)), job.task,
                         job.key or "", job.due_ms, job.lease]
            calls.append((SCRIPTS["ack"],
                          [shard.inflight, shard.jobs, shard.due, shard.bykey, shard.journal,
                           shard.counts],
                          args))
        return calls

    def recover(self, shards: list[ShardKeys], batch: int
                ) -> tuple[int, dict[ShardKeys, DelayQError]]:
        """Return expired leases to the due set: how many were recovered, and the shards
        where that failed (e.g. :class:`DamagedShard`) with why."""
        calls = [(SCRIPTS["recover"], [s.inflight, s.due, s.journal, s.jobs],
                  [batch, self._maxlen]) for s in shards]
        with self.unavailable():
            replies = execute(self.client, calls, raise_errors=False)
        failed = {shard: _shard_error(reply) for shard, reply in zip(shards, replies, strict=True)
                  if isinstance(reply, Exception)}
        return sum(r for r in replies if not isinstance(r, Exception)), failed

    def release(self, claims: list[ShardClaim]) -> int:
        """Return claimed jobs a carrier could not publish to the due set, due now (those
        their lease still holds)."""
        leased: dict[tuple[ShardKeys, str], list[Claimed]] = defaultdict(list)
        for claim in claims:
            for job in claim.jobs:
                leased[claim.shard, job.lease].append(job)
        calls = [(SCRIPTS["recover"], [shard.inflight, shard.due, shard.journal, shard.jobs],
                  [len(jobs), self._maxlen, lease, *(raw_id(job.stored_id) for job in jobs)])
                 for (shard, lease), jobs in leased.items()]
        if not calls:
            return 0
        with self.unavailable():
            return sum(execute(self.client, calls))

    def heartbeat(self, carrier_id: str, lease_ms: int) -> list[str]:
        """Register a live carrier until its lease ends; returns the live carrier ids."""
        now_ms = self.now_ms()
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(self.keys.carriers, {carrier_id: now_ms + lease_ms})
        pipe.zremrangebyscore(self.keys.carriers, "-inf", now_ms)
        pipe.zrange(self.keys.carriers, 0, -1)
        return pipe.execute()[-1]

    def owners(self) -> list[str | None]:
        """The carrier id serving each shard, or None."""
        pipe = self.client.pipeline(transaction=False)
        for shard in self.keys:
            pipe.get(shard.owner)
        return pipe.execute()

    def hold(self, shards: list[ShardKeys], carrier_id: str, lease_ms: int,
             keep: bool) -> list[bool]:
        """Take/renew (``keep``) or release each shard's lease; which ones are ours now."""
        calls = [(SCRIPTS["own"], [s.owner], [carrier_id, lease_ms, "1" if keep else "0"])
                 for s in shards]
        return [bool(r) for r in execute(self.client, calls)] if calls else []

    def leave(self, carrier_id: str, shards: list[ShardKeys]) -> None:
        """A stopping carrier hands its shards back at once."""
        self.hold(shards, carrier_id, 0, keep=False)
        self.client.zrem(self.keys.carriers, carrier_id)

    def dead_letter(self, shard: ShardKeys, job: Claimed, reason: str) -> bool:
        """Move a claimed job that cannot be published to the dead letters (its business
        key, if any, is read from its envelope by the script)."""
        reason = printable(reason)  # text read from bytes that are not UTF-8, as \xNN
        with self.unavailable():
            return bool(SCRIPTS["dead"].call(
                self.client,
                [shard.inflight, shard.jobs, shard.dead, shard.bykey, shard.journal,
                 shard.counts, shard.due],
                [raw_id(job.stored_id), reason, "", self._maxlen, job.lease,
                 "" if job.envelope is None else "1"]))

    def bury(self, job_id: str, key: str | None, envelope: str, reason: str) -> None:
        """Dead-letter a call that is no longer in the store (e.g. a task out of retries).

        It is then listed by :meth:`dead` and put back by :meth:`replay` like any dead job.
        """
        shard = self.keys.shard_for(job_id, key)
        stored = pack_id(job_id)
        entry = json.dumps({"reason": reason, "envelope": envelope,
                            "at": int(time.time() * 1000)})
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            pipe.hset(shard.dead, stored, entry)
            if self._maxlen > 0:
                pipe.xadd(shard.journal, {"event": "dead", "job": stored, "reason": reason},
                          maxlen=self._maxlen, approximate=True)
            pipe.execute()

    def damaged(self) -> dict[int, str]:
        """Shards with a key that holds the wrong type of value: shard -> what is wrong.

        Every script refuses to run on such a shard, so its jobs wait until the key is
        moved away (see :class:`DamagedShard`)."""
        names = list(KEY_TYPES)
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            for shard in self.keys:
                for name in names:
                    pipe.type(getattr(shard, name))
            types = pipe.execute()
        damaged: dict[int, str] = {}
        for n, shard in enumerate(self.keys):
            for name, found in zip(names, types[n * len(names):(n + 1) * len(names)],
                                   strict=True):
                if found not in (KEY_TYPES[name], "none"):
                    damaged.setdefault(shard.shard, f"{getattr(shard, name)} holds a {found}, "
                                                    f"not a {KEY_TYPES[name]}")
        return damaged

    def held(self, jobs: list[tuple[str, str | None]]) -> list[bool]:
        """For each (job id, business key): is the job stored, live or dead-lettered?"""
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            for job_id, key in jobs:
                shard, stored = self.keys.shard_for(job_id, key), pack_id(job_id)
                pipe.hexists(shard.jobs, stored)
                pipe.hexists(shard.dead, stored)
            found = pipe.execute()
        return [bool(found[2 * n] or found[2 * n + 1]) for n in range(len(jobs))]

    def envelopes(self, shard: ShardKeys, job_ids: list[str]) -> dict[str, str | None]:
        """The stored envelopes of jobs of one shard (None where a job is gone)."""
        if not job_ids:
            return {}
        with self.unavailable():
            raws = self.client.hmget(shard.jobs, [pack_id(job_id) for job_id in job_ids])
        return dict(zip(job_ids, cast("list[str | None]", raws), strict=True))

    def read_journal(self, shard: ShardKeys, after: str | None = None, until: str = "+",
                     count: int | None = None) -> list[tuple[str, dict[str, str]]]:
        """Journal entries of a shard after the entry id ``after`` (all when None).

        A ``job`` field that is not a stored job id is left out, and the field
        ``unreadable`` says so.
        """
        with self.unavailable():
            entries = cast("list[tuple[str, dict[str, str]]]", self.client.xrange(
                shard.journal, f"({after}" if after else "-", until, count=count))
        for _, fields in entries:
            if "job" in fields:
                job_id = job_id_of(fields["job"])
                if job_id is None:
                    del fields["job"]
                    fields["unreadable"] = "the job field is not a stored job id"
                else:
                    fields["job"] = job_id
        return entries

    def journal(self, shard: int, event: str, fields: dict[str, Any]) -> None:
        """Append one event to a shard's journal (worker-side events)."""
        self.journal_many([(shard, event, fields)])

    def journal_many(self, entries: list[tuple[int, str, dict[str, Any]]]) -> None:
        """Append ``(shard, event, fields)`` entries to the journals in one round trip."""
        if self._maxlen <= 0 or not entries:
            return
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            for shard, event, fields in entries:
                if "job" in fields:
                    fields = {**fields, "job": pack_id(fields["job"])}
                entry: dict[Any, Any] = {"event": event, **fields}  # xadd's Dict is invariant
                pipe.xadd(self.keys.shard(shard).journal, entry, maxlen=self._maxlen,
                          approximate=True)
            pipe.execute()

    # -- memory (read-only) ------------------------------------------------------------

    @cached_property
    def headroom(self) -> Headroom:
        """Producers' gate: StoreFull past ``delayq_max_memory_fraction`` of maxmemory."""
        return Headroom(self.config.max_memory_fraction, self.memory,
                        redact(self.config.redis_url))

    def memory(self) -> list[Memory]:
        """INFO memory of the store's Redis (of each primary on a cluster)."""
        with self.unavailable():
            if isinstance(self.client, RedisCluster):
                infos = self.client.info("memory", target_nodes=RedisCluster.PRIMARIES)
                return [Memory.from_info(info) for info in infos.values()]
            return [Memory.from_info(self.client.info("memory"))]

    def eviction_policies(self) -> list[str]:
        """``maxmemory-policy`` of the store's Redis (each primary): CONFIG GET, or INFO
        memory where CONFIG is refused (renamed, ACL); "" where neither says."""
        try:
            with self.unavailable():
                if isinstance(self.client, RedisCluster):
                    replies = cast(  # one reply per node (redis-py types one node's)
                        "dict[str, dict[str, str]]",
                        self.client.config_get("maxmemory-policy",
                                               target_nodes=RedisCluster.PRIMARIES))
                    return [reply.get("maxmemory-policy", "") for reply in replies.values()]
                return [self.client.config_get("maxmemory-policy").get("maxmemory-policy") or ""]
        except redis.ResponseError:
            return [memory.policy for memory in self.memory()]


def _refused_for_memory(exc: redis.ResponseError) -> bool:
    """True for Redis's OOM refusal: OutOfMemoryError, or inside a script on Redis 6.2
    ("Error running script ... -OOM command not allowed ...")."""
    return isinstance(exc, redis.exceptions.OutOfMemoryError) or \
        "command not allowed when used memory > 'maxmemory'" in str(exc)


def _shard_claims(shards: list[ShardKeys], replies: list[Any]) -> list[ShardClaim]:
    """The claim script's replies (or errors), one per shard."""
    claims = []
    for shard, reply in zip(shards, replies, strict=True):
        if isinstance(reply, Exception):
            claims.append(ShardClaim(shard, 0, None, [], [], _shard_error(reply)))
            continue
        now_ms, next_due, promoted, lease, rest = reply[0], reply[1], reply[2], reply[3], \
            reply[4:]
        jobs = [Claimed(unpack_id(rest[i]), _due_ms(rest[i + 1]), rest[i + 2], rest[i], lease)
                for i in range(0, len(rest), 3)]
        claims.append(ShardClaim(shard, now_ms, None if next_due == -1 else next_due, jobs,
                                 promoted))
    return claims


def _due_ms(score: str) -> int | None:
    """A due score as Redis replied it; None when it is not a finite number."""
    due = float(score)
    return int(due) if math.isfinite(due) else None


def _shard_error(exc: Exception) -> DelayQError:
    """What a failed script call on one shard means to its caller."""
    if str(exc).startswith(_DAMAGED):
        return DamagedShard(str(exc))
    return DelayQError(f"Redis refused the call: {exc}")


def _dead_letter(stored: str, raw: str, shard: int) -> tuple[dict[str, Any], str]:
    """A dead letter as :meth:`Store.dead` lists it, and why it cannot be read ("" when
    it can)."""
    try:  # the dead script keeps an envelope that is not UTF-8 byte for byte
        entry = json.loads(raw)
    except (ValueError, RecursionError):
        entry = None
    if not isinstance(entry, dict):
        why = "not a JSON object"
    elif type(entry.get("at")) not in (int, float) or datetime_of_ms(entry["at"]) is None:
        why = "no time of death"
    elif not all(isinstance(text, str)
                 for text in (entry.get("reason"), entry.setdefault("envelope", ""))):
        why = "no reason, or an envelope that is not text"
    else:  # a job dead-lettered for its damaged id or bytes: listed, shown printable
        return {**entry, "job_id": job_id_of(stored) or printable(stored), "shard": shard,
                "reason": printable(entry["reason"]),
                "envelope": printable(entry["envelope"])}, ""
    job_id = job_id_of(stored)
    return {"job_id": job_id or printable(stored), "shard": shard, "at": None,
            "reason": f"unreadable dead letter ({why})", "envelope": printable(raw)}, why
