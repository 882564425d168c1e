"""What happens to a job from its claim on: carriers claim due jobs (``claim``,
``claim_ahead``), ack what reached the broker, give back what they could not publish
(``release``) or what a dead carrier left (``recover``), dead-letter what cannot be
published, and hold leases on shards; workers bury calls out of retries and journal what
became of their tasks."""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..errors import DelayQError
from ..events import Event
from ..keys import ShardKeys, bykey_member, digest, pack_id, raw_id, unpack_id
from ..reading import printable
from ..scripts import SCRIPTS, Deferred, Script, execute
from .base import StoreBase, damaged_key, raised, shard_error


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
    task_id: str = ""  # its message's task id: one not its job id has an index, which goes
    #: the claim script pushed it to the broker and forgot it itself: only its task id
    #: index is left to go (Promoted.pushed)
    direct: bool = False

    @classmethod
    def pushed(cls, stored_id: str, task_id: str) -> Promoted:
        """A job the claim script promoted itself whose task id is not its job id."""
        return cls(unpack_id(stored_id), "", None, 0, stored_id, "", task_id, direct=True)


@dataclass(frozen=True)
class ShardClaim:
    shard: ShardKeys
    now_ms: int
    next_due_ms: int | None
    jobs: list[Claimed]  # claimed: the carrier publishes them, then acks
    promoted: list[int]  # due ms of the jobs the claim script pushed to the broker itself
    error: DelayQError | None = None  # the shard's claim failed (e.g. DamagedShard)
    #: those of them whose task id is not their job id, to ack (their task id index goes)
    pushed: list[Promoted] = field(default_factory=list)


@dataclass(frozen=True)
class DirectRoutes:
    """The broker queues the claim script may push plain jobs to (direct promotion)."""

    lists: list[str]  # the broker's list of each queue
    queues: list[tuple[str, int]]  # (queue name, delivery mode) of each list
    origin: str  # the origin header
    repr_max: int  # longest argsrepr / kwargsrepr header


class ClaimAhead:
    """A claim sent by :meth:`Store.claim_ahead` whose reply is not read yet."""

    def __init__(self, store: StoreBase, shards: list[ShardKeys], sent: Deferred,
                 acks: dict[ShardKeys, list[Promoted]], ack_shards: list[ShardKeys],
                 sent_at: float) -> None:
        self.store, self.shards, self._sent, self._ack_shards = store, shards, sent, ack_shards
        self.acks = acks  # sent with it
        #: the shards whose ack sent with it failed, with why (once result() returned)
        self.failed_acks: dict[ShardKeys, DelayQError] = {}
        self.sent_at = sent_at  # time.monotonic() when sent: about when Redis ran it

    def result(self) -> list[ShardClaim]:
        """The claims (a shard's failure in its claim's ``error``, of an ack sent with them
        in ``failed_acks``); raises if Redis failed. Call once."""
        with self.store.unavailable():
            replies = self._sent.replies(raise_errors=False)
        acked = len(self._ack_shards)
        self.failed_acks = _failed(self._ack_shards, replies[:acked])
        return _shard_claims(self.shards, replies[acked:])


class Claims(StoreBase):
    """The carrier's and the workers' side of the store."""

    # -- claims ------------------------------------------------------------------------

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
        ack_shards, ack_calls = self._ack_calls(acks or {})
        with self.unavailable():
            sent = Deferred(self.client,
                            ack_calls + self._claim_calls(shards, batch, lease_ms, direct,
                                                          lead_ms))
        return ClaimAhead(self, shards, sent, acks or {}, ack_shards, time.monotonic())

    def _claim_calls(self, shards: list[ShardKeys], batch: int, lease_ms: int,
                     direct: DirectRoutes | None,
                     lead_ms: int) -> list[tuple[Script, list[str], list[Any]]]:
        lists, routes, origin, repr_max = [], [], "", 0
        if direct is not None:
            lists, routes = direct.lists, [value for route in direct.queues for value in route]
            origin, repr_max = direct.origin, direct.repr_max
        return [(SCRIPTS["claim_due"], SCRIPTS["claim_due"].keys_for(s, *lists),
                 [self._maxlen, batch, lease_ms, s.shard, origin, repr_max,
                  self.config.default_queue, self.config.max_nesting, lead_ms,
                  self.config.max_payload_bytes, *routes])
                for s in shards]

    def ack(self, acks: dict[ShardKeys, list[Promoted]], *,
            raise_errors: bool = True) -> dict[ShardKeys, DelayQError]:
        """Forget jobs that reached the broker, per shard, and journal them as promoted;
        of those the claim script pushed itself, forget the task id index. A shard's
        failure (e.g. a cluster slot moving) is raised, or with ``raise_errors=False``
        returned, with the other shards' (theirs are acked); Redis's is raised."""
        shards, calls = self._ack_calls(acks)
        if not calls:
            return {}
        with self.unavailable():
            failed = _failed(shards, execute(self.client, calls, raise_errors=False))
        if failed and raise_errors:
            raise next(iter(failed.values()))
        return failed

    def _ack_calls(self, acks: dict[ShardKeys, list[Promoted]]
                   ) -> tuple[list[ShardKeys], list[tuple[Script, list[str], list[Any]]]]:
        """The calls that ack ``acks``, and the shard of each."""
        shards, calls = [], []
        for shard, promoted in acks.items():
            pushed = [(job.stored_id, job.task_id) for job in promoted if job.direct]
            if pushed:
                shards.append(shard)
                calls.append(self.unindex_call(shard, pushed))
            jobs = [job for job in promoted if not job.direct]
            if not jobs:
                continue
            keys = SCRIPTS["ack"].keys_for(shard)
            args: list[Any] = [self._maxlen]
            for job in jobs:
                stored = job.stored_id or pack_id(job.job_id)
                index = 0
                if job.task_id and job.task_id != job.job_id:
                    keys.append(self.keys.task_index(shard, pack_id(job.task_id)))
                    index = len(keys)
                args += [raw_id(stored), raw_id(bykey_member(job.key, stored)), job.task,
                         job.key or "", job.due_ms, job.lease, index]
            shards.append(shard)
            calls.append((SCRIPTS["ack"], keys, args))
        return shards, calls

    def recover(self, shards: list[ShardKeys], batch: int
                ) -> tuple[int, dict[ShardKeys, DelayQError]]:
        """Return expired leases to the due set: how many were recovered, and the shards
        where that failed (e.g. :class:`DamagedShard`) with why."""
        calls = [(SCRIPTS["recover"], SCRIPTS["recover"].keys_for(s), [self._maxlen, batch])
                 for s in shards]
        with self.unavailable():
            replies = execute(self.client, calls, raise_errors=False)
        return sum(r for r in replies if not isinstance(r, Exception)), _failed(shards, replies)

    def release(self, claims: list[ShardClaim]) -> int:
        """Return claimed jobs a carrier could not publish to the due set, due now (those
        their lease still holds)."""
        leased: dict[tuple[ShardKeys, str], list[Claimed]] = defaultdict(list)
        for claim in claims:
            for job in claim.jobs:
                leased[claim.shard, job.lease].append(job)
        calls = [(SCRIPTS["recover"], SCRIPTS["recover"].keys_for(shard),
                  [self._maxlen, len(jobs), lease, *(raw_id(job.stored_id) for job in jobs)])
                 for (shard, lease), jobs in leased.items()]
        if not calls:
            return 0
        with self.unavailable():
            return sum(execute(self.client, calls))

    # -- dead letters ------------------------------------------------------------------

    def dead_letter(self, shard: ShardKeys, job: Claimed, reason: str) -> bool:
        """Move a claimed job that cannot be published to the dead letters (its business
        key, if any, is read from its envelope by the script); False when its lease had
        ended. A job scheduled again meanwhile keeps its new copy (True, nothing written)."""
        reason = printable(reason)  # text read from bytes that are not UTF-8, as \xNN
        stored = raw_id(job.stored_id)
        with self.unavailable():
            earlier = self._letters_elsewhere(stored, shard)
            code = SCRIPTS["dead"].call(
                self.client, SCRIPTS["dead"].keys_for(shard),
                [self._maxlen, stored, reason, "", job.lease,
                 "" if job.envelope is None else "1"])
            if code == 1:
                self._supersede_dead_letters(stored, earlier)
        return bool(code)

    def bury(self, job_id: str, key: str | None, envelope: str, reason: str) -> None:
        """Dead-letter a call that is no longer in the store (e.g. a task out of retries).

        It is then listed by :meth:`dead` and put back by :meth:`replay` like any dead job.
        """
        shard = self.keys.shard_for(job_id, key)
        stored = pack_id(job_id)
        entry = json.dumps({"reason": reason, "envelope": envelope,
                            "at": int(time.time() * 1000)})
        with self.unavailable():
            earlier = self._letters_elsewhere(stored, shard)
            pipe = self.client.pipeline(transaction=False)
            pipe.hset(shard.dead, stored, entry)
            if self._maxlen > 0:
                pipe.xadd(shard.journal, {"event": Event.DEAD, "job": stored, "reason": reason},
                          maxlen=self._maxlen, approximate=True)
            raised(pipe.execute(raise_on_error=False))
            self._supersede_dead_letters(stored, earlier)

    def _letters_elsewhere(self, stored: str | bytes,
                           writing: ShardKeys) -> list[tuple[ShardKeys, str]]:
        """The dead letters of ``stored`` on the shards other than ``writing``, read before
        a letter is written there (one round trip; none with one shard). A shard whose dead
        letters cannot be read (a damaged key) is left out: it stops on its own."""
        others = [shard for shard in self.keys if shard is not writing]
        if not others:
            return []
        pipe = self.client.pipeline(transaction=False)
        for shard in others:
            pipe.hget(shard.dead, stored)
        return [(shard, letter) for shard, letter in zip(
            others, pipe.execute(raise_on_error=False), strict=True) if isinstance(letter, str)]

    def _supersede_dead_letters(self, stored: str | bytes,
                                earlier: list[tuple[ShardKeys, str]]) -> None:
        """Make the letter just written the id's only one: remove the ``earlier`` ones
        (:meth:`_letters_elsewhere`), of earlier calls of that id (dead under another business
        key), as it replaces one on its own shard; one round trip when there are any. A letter
        written again since, by a later call of the id, stays (``supersede-1.lua``)."""
        script = SCRIPTS["supersede"]
        if earlier:
            execute(self.client, [(script, script.keys_for(shard), [stored, digest(letter)])
                                  for shard, letter in earlier])

    # -- shard leases ------------------------------------------------------------------

    def heartbeat(self, carrier_id: str, lease_ms: int) -> list[str]:
        """Register a live carrier until its lease ends; returns the live carrier ids."""
        now_ms = self.now_ms()
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(self.keys.carriers, {carrier_id: now_ms + lease_ms})
        pipe.zremrangebyscore(self.keys.carriers, "-inf", now_ms)
        pipe.zrange(self.keys.carriers, 0, -1)
        return pipe.execute()[-1]

    def owners(self) -> tuple[list[str | None], dict[ShardKeys, DelayQError]]:
        """The carrier id serving each shard, or None; and the shards whose lease cannot be
        read (its key damaged), with why: neither served nor free."""
        pipe = self.client.pipeline(transaction=False)
        for shard in self.keys:
            pipe.get(shard.owner)
        replies = pipe.execute(raise_on_error=False)
        failed: dict[ShardKeys, DelayQError] = {
            shard: damaged_key(shard.owner, "string", reply)
            for shard, reply in zip(self.keys, replies, strict=True)
            if isinstance(reply, Exception)}
        return [None if isinstance(r, Exception) else r for r in replies], failed

    def hold(self, shards: list[ShardKeys], carrier_id: str, lease_ms: int,
             keep: bool) -> list[bool]:
        """Take/renew (``keep``) or release each shard's lease; which ones are ours now."""
        calls = [(SCRIPTS["own"], SCRIPTS["own"].keys_for(s),
                  [carrier_id, lease_ms, "1" if keep else "0"])
                 for s in shards]
        return [bool(r) for r in execute(self.client, calls)] if calls else []

    def leave(self, carrier_id: str, shards: list[ShardKeys]) -> None:
        """A stopping carrier hands its shards back at once."""
        self.hold(shards, carrier_id, 0, keep=False)
        self.client.zrem(self.keys.carriers, carrier_id)


def _shard_claims(shards: list[ShardKeys], replies: list[Any]) -> list[ShardClaim]:
    """The claim script's replies (or errors), one per shard."""
    claims = []
    for shard, reply in zip(shards, replies, strict=True):
        if isinstance(reply, Exception):
            claims.append(ShardClaim(shard, 0, None, [], [], shard_error(reply)))
            continue
        now_ms, next_due, promoted, lease, indexed = reply[:5]
        rest = reply[5:]
        jobs = [Claimed(unpack_id(rest[i]), _due_ms(rest[i + 1]), rest[i + 2], rest[i], lease)
                for i in range(0, len(rest), 3)]
        pushed = [Promoted.pushed(indexed[i], indexed[i + 1]) for i in range(0, len(indexed), 2)]
        claims.append(ShardClaim(shard, now_ms, None if next_due == -1 else next_due, jobs,
                                 promoted, pushed=pushed))
    return claims


def _failed(shards: list[ShardKeys], replies: list[Any]) -> dict[ShardKeys, DelayQError]:
    """The shards of the calls that failed, with why."""
    return {shard: shard_error(reply) for shard, reply in zip(shards, replies, strict=True)
            if isinstance(reply, Exception)}


def _due_ms(score: str) -> int | None:
    """A due score as Redis replied it; None when it is not a finite number."""
    due = float(score)
    return int(due) if math.isfinite(due) else None


