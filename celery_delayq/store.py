"""The Redis delay store: every read and write of the keys named in :mod:`keys`.

Writes go through the Lua scripts in ``scripts/``, one atomic call per shard; reads are
plain commands, pipelined across shards.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from typing import Any, NamedTuple

import redis
from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError

from .conf import DelayQConfig
from .connection import connect, redact
from .envelope import Call, Job
from .errors import ConfigurationError, JobExists, PayloadError, StoreFull, StoreUnavailable
from .keys import Keyspace, ShardKeys, bykey_member, pack_id, unpack_id
from .memory import Headroom, Memory
from .scripts import SCRIPTS, Deferred, Script, execute
from .validation import Due

_NETWORK_ERRORS = (redis.ConnectionError, redis.TimeoutError, ClusterDownError)
_SCAN_CHUNK = 500
_SCHEDULE_CHUNK = 1000  # jobs per schedule script call


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
    due_ms: int
    envelope: str | None
    stored_id: str  # the job id as stored (keys.pack_id)


class Promoted(NamedTuple):
    """A claimed job that reached the broker, as ``ack`` journals it."""

    job_id: str
    task: str
    key: str | None
    due_ms: int
    stored_id: str = ""  # the job id as stored (keys.pack_id); worked out when not given


@dataclass(frozen=True)
class ShardClaim:
    shard: ShardKeys
    now_ms: int
    next_due_ms: int | None
    jobs: list[Claimed]  # claimed: the carrier publishes them, then acks
    promoted: list[int]  # due ms of the jobs the claim script pushed to the broker itself


@dataclass(frozen=True)
class DirectRoutes:
    """The broker queues the claim script may push plain jobs to (direct promotion)."""

    lists: list[str]  # the broker's list of each queue
    queues: list[tuple[str, int]]  # (queue name, delivery mode) of each list
    default_queue: str  # the queue of envelopes that name none
    origin: str  # the origin header
    repr_max: int  # longest argsrepr / kwargsrepr header


class ClaimAhead:
    """A claim sent by :meth:`Store.claim_ahead` whose reply is not read yet."""

    def __init__(self, store: Store, shards: list[ShardKeys], sent: Deferred, acks: int,
                 sent_at: float) -> None:
        self.store, self.shards, self._sent, self._acks = store, shards, sent, acks
        self.sent_at = sent_at  # time.monotonic() when sent: about when Redis ran it

    def result(self) -> list[ShardClaim]:
        """The claims; raises if the acks sent with them or the claim failed. Call once."""
        with self.store.unavailable():
            replies = self._sent.replies()
        return _shard_claims(self.shards, replies[self._acks:])


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

    def _check_shard_count(self, client: redis.Redis) -> None:
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
        if int(stored) != self.keys.shards:
            raise ConfigurationError(
                f"the store under prefix {self.keys.prefix!r} was created with "
                f"delayq_shards={stored}, this app says {self.keys.shards}; use the same value "
                "(or a new delayq_prefix) so every job can be found"
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
            if _refused_for_memory(exc):
                self.headroom.refused()
                raise StoreFull(f"Redis at {redact(self.config.redis_url)} refused a write: "
                                "it is at its maxmemory") from exc
            raise

    def now_ms(self) -> int:
        """Redis's clock, in ms: the clock every due time follows."""
        seconds, micros = self.client.time()
        return seconds * 1000 + micros // 1000

    def pubsub(self):
        return self.client.pubsub(ignore_subscribe_messages=True)

    def close(self) -> None:
        if "client" in self.__dict__:
            self.client.close()
            del self.__dict__["client"]

    # -- producer side -----------------------------------------------------------------

    def schedule(self, items: list[tuple[Call, Due]], if_exists: str) -> list[Scheduled]:
        """Store calls in one round trip: one script call per shard and batch."""
        by_shard: dict[ShardKeys, list[int]] = defaultdict(list)
        for index, (call, _) in enumerate(items):
            by_shard[self.keys.shard_for(call.job_id, call.key)].append(index)
        calls, owners = [], []
        for shard, indexes in by_shard.items():
            for start in range(0, len(indexes), _SCHEDULE_CHUNK):
                chunk = indexes[start:start + _SCHEDULE_CHUNK]
                args: list[Any] = [if_exists, self.keys.wake_channel, shard.shard, self._maxlen]
                for index in chunk:
                    call, due = items[index]
                    args += [call.stored_id, call.envelope, *due.script_args(),
                             bykey_member(call.key, call.stored_id), call.task, call.key or ""]
                calls.append((SCRIPTS["schedule"],
                              [shard.due, shard.jobs, shard.bykey, shard.journal, shard.counts],
                              args))
                owners.append(chunk)
        with self.unavailable():
            self.headroom.check(sum(len(call.envelope) for call, _ in items))
            if len(calls) == 1:  # one round trip either way; a lone EVALSHA costs less
                replies = [calls[0][0].call(self.client, calls[0][1], calls[0][2])]
            else:
                replies = execute(self.client, calls, raise_errors=False)
        failed = next((reply for reply in replies if isinstance(reply, Exception)), None)
        if failed is not None:
            self._refuse(failed, [items[index][0].job_id
                                  for chunk, reply in zip(owners, replies, strict=True)
                                  if not isinstance(reply, Exception)
                                  for offset, index in enumerate(chunk)
                                  if reply[3 * offset] in (1, 2)])
        results: list[Scheduled] = [None] * len(items)  # type: ignore[list-item]
        for chunk, reply in zip(owners, replies, strict=True):
            for offset, index in enumerate(chunk):
                code, due_ms, existing = reply[3 * offset:3 * offset + 3]
                results[index] = Scheduled(_CODES[code], due_ms, existing)
        return results

    def _refuse(self, failed: Exception, stored: list[str]) -> None:
        """Raise a failed schedule call's error; each call is atomic (a script refused for
        memory wrote nothing), so ``stored`` (written by the calls that ran) is exact."""
        if isinstance(failed, redis.ResponseError) and _refused_for_memory(failed):
            self.headroom.refused()
            raise StoreFull(f"Redis at {redact(self.config.redis_url)} refused a write: it is "
                            "at its maxmemory", stored) from failed
        with self.unavailable():
            raise failed

    def cancel(self, job_id: str, key: str | None = None, by: str = "") -> CancelOutcome:
        """Cancel one pending job; the outcome says whether it will still run."""
        shards = [self.keys.shard_for(job_id, key)]
        code = self._cancel(shards[0], "id", job_id, by)[0]
        if code == -1 and key is None:
            found = self._shards_holding(job_id)
            if found and found[0] is not shards[0]:
                code = self._cancel(found[0], "id", job_id, by)[0]
        return {1: CancelOutcome.CANCELLED, 0: CancelOutcome.TOO_LATE}.get(
            code, CancelOutcome.UNKNOWN)

    def cancel_key(self, key: str, by: str = "") -> int:
        """Cancel every pending job with this business key; returns how many."""
        return self._cancel(self.keys.shard_for("", key), "key", key, by)[1]

    def _cancel(self, shard: ShardKeys, kind: str, value: str, by: str) -> list[int]:
        with self.unavailable():
            return SCRIPTS["cancel"].call(
                self.client,
                [shard.due, shard.jobs, shard.inflight, shard.bykey, shard.journal,
                 shard.counts],
                [kind, pack_id(value) if kind == "id" else value, self._maxlen, by])

    def reschedule(self, job_id: str, due: Due, key: str | None = None) -> int | None:
        """Move a pending job to a new due time; returns it (ms) or None if not pending."""
        for shard in self._candidates(job_id, key):
            with self.unavailable():
                ok, due_ms = SCRIPTS["reschedule"].call(
                    self.client, [shard.due, shard.jobs, shard.journal],
                    [pack_id(job_id), *due.script_args(), self.keys.wake_channel, shard.shard,
                     self._maxlen])
            if ok:
                return due_ms
        return None

    # -- reads -------------------------------------------------------------------------

    def _candidates(self, job_id: str, key: str | None) -> list[ShardKeys]:
        if key is not None:
            return [self.keys.shard_for(job_id, key)]
        return self._shards_holding(job_id)

    def _shards_holding(self, job_id: str) -> list[ShardKeys]:
        """Shards whose job hash holds ``job_id``, the id's own shard first."""
        own = self.keys.shard_for(job_id)
        order = [own, *(s for s in self.keys if s is not own)]
        stored = pack_id(job_id)
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            for shard in order:
                pipe.hexists(shard.jobs, stored)
            found = pipe.execute()
        return [shard for shard, hit in zip(order, found, strict=True) if hit]

    def get(self, job_id: str, key: str | None = None) -> Job | None:
        """The stored job, pending (``scheduled``), being promoted (``claimed``) or ``dead``."""
        shards = [self.keys.shard_for(job_id, key)] if key else list(self.keys)
        stored = pack_id(job_id)
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            for shard in shards:
                pipe.hget(shard.jobs, stored)
                pipe.zscore(shard.due, stored)
                pipe.hget(shard.dead, stored)
            replies = pipe.execute()
        for i, shard in enumerate(shards):
            raw, due_ms, dead = replies[3 * i:3 * i + 3]
            if raw is not None:
                state = "scheduled" if due_ms is not None else "claimed"
                return Job.from_envelope(job_id, raw, due_ms, state, shard.shard,
                                         self.config.default_queue)
            if dead is not None:
                return Job.dead(job_id, json.loads(dead), shard.shard,
                                self.config.default_queue)
        return None

    def pending(self, task: str | None = None, key: str | None = None,
                limit: int = 100) -> list[Job]:
        """Pending jobs in due order, optionally of one task and/or one business key."""
        shards = [self.keys.shard_for("", key)] if key else list(self.keys)
        jobs: list[Job] = []
        with self.unavailable():
            for shard in shards:
                jobs.extend(self._pending_in(shard, task, key, limit))
        jobs.sort(key=lambda job: job.due)
        return jobs[:limit]

    def _pending_in(self, shard: ShardKeys, task: str | None, key: str | None,
                    limit: int) -> list[Job]:
        if key:
            members = self.client.zrangebylex(shard.bykey, f"[{key}\x00", f"({key}\x01")
            ids = [m.split("\x00", 1)[1] for m in members]
            pipe = self.client.pipeline(transaction=False)
            for job_id in ids:
                pipe.zscore(shard.due, job_id)
            scored = [(i, s) for i, s in zip(ids, pipe.execute(), strict=True) if s is not None]
            return self._jobs_of(shard, scored, task)[:limit]
        found: list[Job] = []
        start = 0
        while len(found) < limit:
            chunk = self.client.zrange(shard.due, start, start + _SCAN_CHUNK - 1, withscores=True)
            if not chunk:
                break
            found.extend(self._jobs_of(shard, chunk, task))
            start += _SCAN_CHUNK
        return found[:limit]

    def _jobs_of(self, shard: ShardKeys, scored: list[tuple[str, float]],
                 task: str | None) -> list[Job]:
        if not scored:
            return []
        raws = self.client.hmget(shard.jobs, [stored for stored, _ in scored])
        jobs = []
        for (stored, due_ms), raw in zip(scored, raws, strict=True):
            try:
                job = Job.from_envelope(unpack_id(stored), raw, due_ms, "scheduled",
                                        shard.shard, self.config.default_queue)
            except PayloadError:
                continue  # unreadable: the carrier dead-letters it when due
            if task is None or job.task == task:
                jobs.append(job)
        return jobs

    def dead(self, limit: int = 100) -> list[dict[str, Any]]:
        """Dead-lettered jobs with their reason, newest first."""
        entries = []
        with self.unavailable():
            for shard in self.keys:
                for stored, raw in self.client.hscan_iter(shard.dead, count=_SCAN_CHUNK):
                    entries.append({"job_id": unpack_id(stored), "shard": shard.shard,
                                    **json.loads(raw)})
        entries.sort(key=lambda e: e["at"], reverse=True)
        return entries[:limit]

    def replay(self, job_id: str, envelope: str = "") -> bool:
        """Put a dead-lettered job back, due now (optionally with a fixed envelope)."""
        for shard in self.keys:
            with self.unavailable():
                code = SCRIPTS["replay"].call(
                    self.client,
                    [shard.dead, shard.jobs, shard.due, shard.bykey, shard.journal, shard.counts],
                    [pack_id(job_id), envelope, self._maxlen, self.keys.wake_channel,
                     shard.shard])
            if code == -1:
                raise JobExists(job_id)
            if code == 1:
                return True
        return False

    def stats(self) -> list[dict[str, Any]]:
        """Per-shard counts: pending, overdue, in flight, dead, journal length, next due.

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
                pipe.zrange(shard.due, 0, 0, withscores=True)
            replies = pipe.execute()
        rows = []
        for shard in self.keys:
            pending, overdue, inflight, dead, journal, head = replies[:6]
            replies = replies[6:]
            rows.append({
                "shard": shard.shard, "pending": pending, "overdue": overdue,
                "inflight": inflight, "dead": dead, "journal": journal,
                "next_due_ms": int(head[0][1]) if head else None, "now_ms": now_ms,
            })
        return rows

    def earliest(self) -> tuple[int, str, ShardKeys] | None:
        """(due ms, job id, shard) of the first pending job, or None."""
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            for shard in self.keys:
                pipe.zrange(shard.due, 0, 0, withscores=True)
            heads = [(int(head[0][1]), unpack_id(head[0][0]), shard)
                     for shard, head in zip(self.keys, pipe.execute(), strict=True) if head]
        return min(heads, key=lambda head: head[0], default=None)

    def counts(self) -> tuple[dict[str, int], int]:
        """Jobs stored per task name (pending or being promoted), and cancels so far."""
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            for shard in self.keys:
                pipe.hgetall(shard.counts)
            per_shard = pipe.execute()
        tasks: dict[str, int] = defaultdict(int)
        for counts in per_shard:
            for task, n in counts.items():
                tasks[task] += int(n)
        cancelled = tasks.pop("", 0)
        return {task: n for task, n in tasks.items() if n}, cancelled

    # -- carrier side ------------------------------------------------------------------

    def claim(self, shards: list[ShardKeys], batch: int, lease_ms: int,
              direct: DirectRoutes | None = None) -> list[ShardClaim]:
        """Claim up to ``batch`` due jobs on each shard, in one round trip; with ``direct``,
        plain jobs for those queues are pushed to the broker by the script instead."""
        with self.unavailable():
            replies = execute(self.client, self._claim_calls(shards, batch, lease_ms, direct))
        return _shard_claims(shards, replies)

    def claim_ahead(self, shards: list[ShardKeys], batch: int, lease_ms: int,
                    direct: DirectRoutes | None = None,
                    acks: dict[ShardKeys, list[Promoted]] | None = None) -> ClaimAhead:
        """Send :meth:`ack` of ``acks`` and :meth:`claim` now, read the claims later: Redis
        runs both while the carrier publishes what it claimed before."""
        ack_calls = self._ack_calls(acks or {})
        with self.unavailable():
            sent = Deferred(self.client,
                            ack_calls + self._claim_calls(shards, batch, lease_ms, direct))
        return ClaimAhead(self, shards, sent, len(ack_calls), time.monotonic())

    def _claim_calls(self, shards: list[ShardKeys], batch: int, lease_ms: int,
                     direct: DirectRoutes | None) -> list[tuple[Script, list[str], list[Any]]]:
        lists, routes, origin, repr_max, default = [], [], "", 0, ""
        if direct is not None:
            lists, routes = direct.lists, [value for route in direct.queues for value in route]
            origin, repr_max, default = direct.origin, direct.repr_max, direct.default_queue
        return [(SCRIPTS["claim_due"],
                 [s.due, s.inflight, s.jobs, s.bykey, s.journal, s.counts, *lists],
                 [batch, lease_ms, self._maxlen, s.shard, origin, repr_max, default, *routes])
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
                args += [stored, bykey_member(job.key, stored), job.task, job.key or "",
                         job.due_ms]
            calls.append((SCRIPTS["ack"],
                          [shard.inflight, shard.jobs, shard.due, shard.bykey, shard.journal,
                           shard.counts],
                          args))
        return calls

    def recover(self, shards: list[ShardKeys], batch: int) -> int:
        """Return expired leases to the due set; how many were recovered."""
        calls = [(SCRIPTS["recover"], [s.inflight, s.due, s.journal, s.jobs],
                  [batch, self._maxlen]) for s in shards]
        return sum(execute(self.client, calls))

    def release(self, claims: list[ShardClaim]) -> int:
        """Return claimed jobs a carrier could not publish to the due set, due now."""
        calls = [(SCRIPTS["recover"], [c.shard.inflight, c.shard.due, c.shard.journal,
                                       c.shard.jobs],
                  [len(c.jobs), self._maxlen, *(job.stored_id for job in c.jobs)])
                 for c in claims if c.jobs]
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

    def dead_letter(self, shard: ShardKeys, job_id: str, reason: str,
                    key: str | None) -> bool:
        """Move a claimed job that cannot be published to the dead letters."""
        stored = pack_id(job_id)
        return bool(SCRIPTS["dead"].call(
            self.client,
            [shard.inflight, shard.jobs, shard.dead, shard.bykey, shard.journal, shard.counts],
            [stored, reason, bykey_member(key, stored), self._maxlen]))

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
        return dict(zip(job_ids, raws, strict=True))

    def read_journal(self, shard: ShardKeys, after: str | None = None, until: str = "+",
                     count: int | None = None) -> list[tuple[str, dict[str, str]]]:
        """Journal entries of a shard after the entry id ``after`` (all when None)."""
        with self.unavailable():
            entries = self.client.xrange(shard.journal, f"({after}" if after else "-", until,
                                         count=count)
        for _, fields in entries:
            if "job" in fields:
                fields["job"] = unpack_id(fields["job"])
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
                pipe.xadd(self.keys.shard(shard).journal, {"event": event, **fields},
                          maxlen=self._maxlen, approximate=True)
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
                    replies = self.client.config_get("maxmemory-policy",
                                                     target_nodes=RedisCluster.PRIMARIES)
                    return [reply.get("maxmemory-policy", "") for reply in replies.values()]
                return [self.client.config_get("maxmemory-policy").get("maxmemory-policy", "")]
        except redis.ResponseError:
            return [memory.policy for memory in self.memory()]


def _refused_for_memory(exc: redis.ResponseError) -> bool:
    """True for Redis's OOM refusal: OutOfMemoryError, or inside a script on Redis 6.2
    ("Error running script ... -OOM command not allowed ...")."""
    return isinstance(exc, redis.exceptions.OutOfMemoryError) or \
        "command not allowed when used memory > 'maxmemory'" in str(exc)


def _shard_claims(shards: list[ShardKeys], replies: list[Any]) -> list[ShardClaim]:
    """The claim script's replies, one per shard."""
    claims = []
    for shard, reply in zip(shards, replies, strict=True):
        now_ms, next_due, promoted, rest = reply[0], reply[1], reply[2], reply[3:]
        jobs = [Claimed(unpack_id(rest[i]), int(float(rest[i + 1])), rest[i + 2], rest[i])
                for i in range(0, len(rest), 3)]
        claims.append(ShardClaim(shard, now_ms, None if next_due == -1 else next_due, jobs,
                                 promoted))
    return claims
