"""Every Redis key and channel name celery-delayq uses, and nothing else.

All keys of one shard share the hash tag ``{N}`` so each Lua script touches a single
Redis Cluster slot. Job ids are stored packed (:func:`pack_id`) wherever they appear:
members, fields, journal entries::

    <prefix>:{N}:due       ZSET  job id -> due time (ms, Redis clock)
    <prefix>:{N}:inflight  ZSET  job id -> lease deadline (ms) while a carrier publishes it
    <prefix>:{N}:jobs      HASH  job id -> envelope (three lines of JSON, see envelope.py);
                           KEPT + job id -> the envelope of the copy a carrier holds while
                           a later call of that id stands in its place (invariant 8)
    <prefix>:{N}:bykey     ZSET  "<business key>\\0<job id>" (score 0), a lexicographic index
    <prefix>:{N}:dead      HASH  job id -> {"reason", "envelope", "at"} (JSON)
    <prefix>:{N}:journal   STREAM lifecycle events, capped
    <prefix>:{N}:owner     STRING id of the carrier serving the shard, expires with its lease
    <prefix>:{N}:counts    HASH  task name -> jobs stored (pending or being promoted);
                           the field "" (never a task name) counts cancels
    <prefix>:{N}:paused    HASH  "task:<name>" / "queue:<name>" -> who paused it and when
                           (JSON), the same on every shard (see pausing.py)
    <prefix>:{N}:limits    HASH  "rate:<queue>" -> the shard's token bucket of a queue's
                           rate limit, "bucket:<queue>" -> its tokens (see ratelimit.py)
    <prefix>:{N}:waiting   ZSET  "<queue>\0<due>\0<job id>" (score 0): the jobs rate
                           limits hold, each queue's in the order they go (claim_due)
    <prefix>:{N}:releasing HASH  "paused" / "rate:<queue>" -> "<token> <ms> <where>": the
                           walk giving back held jobs after a resume or a rate limit's
                           removal, while it is under way (scripts/include/releasing.lua)
    <prefix>:{N}:reserved:<job id>  STRING token of the call holding that id: a producer
                           scheduling it, a replay, a cancel or reschedule looking for
                           it (of shard N's own, whatever its business key), expires by itself
    <prefix>:{N}:task:<task id>  STRING the job id of a job stored on shard N whose task
                           id is not its job id (scheduled with an id of its own), so
                           Celery's revoke finds it; goes when an ack, a direct
                           promotion, a cancel or a replace under a new task id takes
                           the job, else (a dead letter) expires a day after its due time
    <prefix>:{N}:revoked:<task id>  STRING set by a revoke of that task id (of the shard
                           of the id), expires as a worker forgets a revoke
                           (``CELERY_WORKER_REVOKE_EXPIRES``, 3 hours): the task's retry,
                           stored by its run after the revoke, is cancelled (revoke.py)
    <prefix>:{N}:outcome:<run>  HASH  job id -> "<code> <row>": what a run (a Spark job)
                           did with each input row, so a row is written at most once in it
    <prefix>:{N}:answer:<token>  STRING the reply of one cancel, replay or drop call, kept a
                           minute: the call sent again after its reply was lost gets it
                           instead of a second run's (scripts/include/answer.lua); for a
                           batch of a worker's events, "1" for one resend window: the
                           batch sent again is not journaled twice (worker_events-1+.lua)
    <prefix>:meta          HASH  store-wide facts (the shard count it was created with; its
                           format, store.base.FORMAT; an id, new when the store is made
                           again: its Redis lost its data; the task_default_queue of a
                           job stored without its queue)
    <prefix>:export        HASH  shard -> id of the last journal entry exported (delayq export)
    <prefix>:exporting     STRING "<Redis ms it began> <host:pid> <token>" of the export
                           running (one at a time), expires unless that run renews it
    <prefix>:carriers      ZSET  carrier id -> heartbeat deadline (ms), the live carriers
    <prefix>:wake          pub/sub channel: a shard number, when a new job became its head

Direct promotion also pushes onto the broker's queue lists, named as kombu's Redis
transport names them (:func:`broker_queue`).

Invariants
----------
What the scripts (``scripts/*.lua``) keep true on every shard, each in one atomic call.
This is the one place they are written down: ``delayq check`` (check.py) verifies 1-8 and
repairs what breaks them (an evicting Redis, a hand-edited key, a bug).

1. Every ``due`` member has a ``jobs`` entry (a pending job has its envelope).
2. Every ``inflight`` member has a ``jobs`` entry (a claimed job has its envelope), except
   while its lease lasts when the job moved to a business key of another shard meanwhile
   (``cancel`` "move"): its carrier's ack, release or dead-letter then only ends the lease.
3. Every ``jobs`` field is in ``due`` or ``inflight``; one in neither is an *orphaned
   envelope*: no carrier will ever promote it.
4. A job in both ``due`` and ``inflight`` is legal: it was scheduled again while a carrier
   published it; ``ack`` then keeps it (pending, envelope, count and ``bykey`` member),
   ``recover`` keeps its new due time and ``dead`` only ends the lease.
5. ``bykey``: every member ``"<key>\0<id>"`` names a ``jobs`` entry whose envelope's first
   line has that key (``y``). A member is added with its envelope (``schedule``, ``replay``)
   and removed when the envelope goes or changes its key: ``schedule`` replacing it,
   ``cancel``, ``ack``, ``claim_due`` pushing it to the broker itself, ``dead``, ``repair``.
   A pending job with a key has its member. A job cancelled while an earlier copy was in
   flight (the cancel answered "too late") leaves that copy's envelope (8.) without a
   member; if the carrier dies, ``recover`` puts the member back with the copy it makes
   pending again.
6. ``counts``: per task name, the number of ``jobs`` entries whose first line names that
   task (``t``): jobs pending or being promoted, never dead ones. +1 when an envelope of the
   task is written where none was (``schedule`` new; ``schedule`` replacing: -1 for the old
   envelope's task, +1 for the new one's; ``replay``); -1 when an envelope leaves ``jobs``
   (``ack`` of a job not scheduled again, ``claim_due``'s direct push, ``cancel`` when no
   carrier holds the job or it moves, ``dead``, ``repair`` of an orphan); a ``cancel`` that
   puts back the envelope of a copy in flight (8.) counts both; ``repair`` adds
   the difference ``check`` found. The field ``""`` (never a task name) is not a job count:
   +1 per job ``cancel`` removed (not for a move), never decremented (``Store.counts``
   returns it apart, as cancels so far).
7. A due score is a due time in ms, or a held one (held.py): ``PAUSED_BASE`` or ``RATE_BASE``
   + the due time. Every ``waiting`` member names a job rate limits hold; one whose job's
   score is no longer ``RATE_BASE`` + that due time (cancelled, rescheduled, replaced) is
   stale and ``claim_due`` drops it when it meets it. A held job is held by something in
   force: one held by a pause is of a task or queue the shard's ``paused`` hash names; one
   held by a rate limit is of a queue with a limit in force in ``limits`` and has its
   ``waiting`` member (else it is *stranded*: nothing would release it).
8. A *kept* field (``KEPT`` + job id, never a job id: ids hold no control character) is in
   ``jobs`` only for an id in ``inflight``. It holds the envelope of the copy that lease is
   for, written when that envelope leaves its field while the lease lasts: ``schedule``
   replacing a job that is not pending, ``cancel`` "move". A ``cancel`` of the pending copy
   (the carrier still holds the old one: "too late") puts it back, so a carrier that dies
   has its own call recovered or dead-lettered, never the cancelled one. A lease that ends
   takes it (``ack``, ``recover``, ``dead``, ``claim_due`` leasing the id again, ``repair``
   of a dangling member). It is not a job: not counted (6.), not an orphan (3.). In ``jobs``
   rather than a key of its own so that every script keeps its keys: during a Redis
   Cluster slot migration a call naming a key that does not exist yet meets TRYAGAIN.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from dataclasses import dataclass
from zlib import crc32

#: Separator between business key and job id in the ``bykey`` index members.
KEY_SEP = "\x00"
#: First character of a ``jobs`` field that keeps a copy in flight (invariant 8, kept.lua).
KEPT = "\x01"
#: First character of a stored job id that packs a UUID (see :func:`pack_id`).
PACKED = "~"
_PACKED_UUID = re.compile(r"~[A-Za-z0-9_-]{21}", re.ASCII)  # what pack_id makes of a UUID


@dataclass(frozen=True)
class ShardKeys:
    """The names of one shard's keys."""

    shard: int
    due: str
    inflight: str
    jobs: str
    bykey: str
    dead: str
    journal: str
    owner: str
    counts: str
    paused: str
    limits: str
    waiting: str
    releasing: str

    def __hash__(self) -> int:  # a dict key per job when scheduling: the number suffices
        return self.shard


#: The Redis type each store-wide key holds (``Keyspace`` attribute -> ``TYPE``).
STORE_KEY_TYPES = {"meta": "hash", "export_position": "hash", "export_lock": "string",
                   "carriers": "zset"}
#: The Redis type each key of a shard holds (``TYPE``); any other type means damage.
KEY_TYPES = {"due": "zset", "inflight": "zset", "jobs": "hash", "bykey": "zset",
             "dead": "hash", "journal": "stream", "owner": "string", "counts": "hash",
             "paused": "hash", "limits": "hash",
             "waiting": "zset", "releasing": "hash"}


class Keyspace:
    """Names under one prefix; the only place key names are built."""

    def __init__(self, prefix: str, shards: int) -> None:
        self.prefix = prefix
        self.shards = shards
        self.meta = f"{prefix}:meta"
        self.wake_channel = f"{prefix}:wake"
        self.export_position = f"{prefix}:export"
        self.export_lock = f"{prefix}:exporting"
        self.carriers = f"{prefix}:carriers"
        self._shards = tuple(self._build(n) for n in range(shards))
        self._shard_key = re.compile(rf"{re.escape(prefix)}:\{{\d+\}}:")

    def queue_problem(self, queue: str, global_keyprefix: str) -> str | None:
        """Why kombu's Redis transport would keep ``queue``'s messages in a key of the store
        (its list is ``global_keyprefix`` + ``queue``; every key of a shard begins
        ``<prefix>:{<shard number>}:``), or None. On the store's Redis that list would
        damage the key."""
        listed = broker_queue(global_keyprefix, queue)
        if listed in (self.meta, self.export_position, self.export_lock, self.carriers) \
                or self._shard_key.match(listed):
            return (f"queue {queue!r} would keep its messages in a key of the delay store "
                    f"(kombu's list {listed!r} is under delayq_prefix {self.prefix!r}); name "
                    "the queue otherwise")
        return None

    def _build(self, n: int) -> ShardKeys:
        tag = f"{self.prefix}:{{{n}}}"
        return ShardKeys(
            shard=n,
            due=f"{tag}:due",
            inflight=f"{tag}:inflight",
            jobs=f"{tag}:jobs",
            bykey=f"{tag}:bykey",
            dead=f"{tag}:dead",
            journal=f"{tag}:journal",
            owner=f"{tag}:owner",
            counts=f"{tag}:counts",
            paused=f"{tag}:paused",
            limits=f"{tag}:limits",
            waiting=f"{tag}:waiting",
            releasing=f"{tag}:releasing",
        )

    def shard(self, n: int) -> ShardKeys:
        return self._shards[n]

    def __iter__(self):
        return iter(self._shards)

    def shard_for(self, job_id: str, key: str | None = None) -> ShardKeys:
        """A job lives on the shard of its business key, or of its id when it has none."""
        return self._shards[crc32((key or job_id).encode()) % self.shards]

    def reservation(self, job_id: str, stored_id: str) -> str:
        """The key a producer holds while it schedules ``job_id``: on the id's own shard."""
        return f"{self.prefix}:{{{self.shard_for(job_id).shard}}}:reserved:{stored_id}"

    def task_index(self, shard: ShardKeys, stored_task_id: str) -> str:
        """Where a job on ``shard`` whose task id is not its job id is found by task id."""
        return f"{self.prefix}:{{{shard.shard}}}:task:{stored_task_id}"

    def revoked(self, task_id: str) -> str:
        """What says ``task_id`` was revoked: on the shard of the id."""
        return f"{self.prefix}:{{{self.shard_for(task_id).shard}}}:revoked:{pack_id(task_id)}"

    def answer(self, shard: ShardKeys, token: str) -> str:
        """Where one call on ``shard`` keeps its reply (``token``: unique per call)."""
        return f"{self.prefix}:{{{shard.shard}}}:answer:{token}"

    def outcome(self, shard: ShardKeys, run: str) -> str:
        """What a run did with the input rows whose jobs live on ``shard``."""
        return f"{self.prefix}:{{{shard.shard}}}:outcome:{run}"


def bykey_member(key: str | None, job_id: str) -> str:
    """The ``bykey`` index member of a job, or ``""`` when it has no business key."""
    return f"{key}{KEY_SEP}{job_id}" if key else ""


def broker_queue(global_keyprefix: str, queue: str) -> str:
    """The list kombu's Redis transport keeps a queue's messages of priority 0 in."""
    return f"{global_keyprefix}{queue}"


def pack_id(job_id: str) -> str:
    """A job id as Redis stores it.

    A version-4 UUID in canonical form (the default job id: Celery's task id) becomes ``~``
    and 21 base64url characters holding its 31 hex digits other than the version digit.
    At 22 characters or fewer Redis keeps a string in a 32-byte allocation instead of 48, so
    each copy (due member, jobs field) takes 16 bytes less. Other ids are kept, with one
    more ``~`` in front of those that start with one.
    """
    if len(job_id) == 36 and job_id[14] == "4" and job_id == job_id.lower() and \
            job_id[8] == job_id[13] == job_id[18] == job_id[23] == "-":
        try:
            packed = _packed(job_id.replace("-", ""))
        except ValueError:  # not hex
            packed = ""
        if len(packed) == 22:  # else fromhex skipped whitespace: fewer than 16 bytes
            return packed
    return PACKED + job_id if job_id.startswith(PACKED) else job_id


def new_job_id() -> tuple[str, str]:
    """A random version-4 UUID, as Celery's ``uuid()`` makes task ids, and its
    :func:`pack_id` form, made together from one draw (twice as fast as both apart)."""
    d = os.urandom(16).hex()
    d = f"{d[:12]}4{d[13:16]}{'89ab'[int(d[16], 16) & 3]}{d[17:]}"  # version 4, RFC 4122
    return f"{d[:8]}-{d[8:12]}-{d[12:16]}-{d[16:20]}-{d[20:]}", _packed(d)


def _packed(digits: str) -> str:
    """``~`` and a UUID's 32 hex digits but its version digit (the 13th) in base64url: 31
    digits and a 0 make 128 bits, 21 characters and 2 bits of a 22nd, left out."""
    return PACKED + base64.urlsafe_b64encode(bytes.fromhex(f"{digits[:12]}{digits[13:]}0")
                                             )[:21].decode()


def raw_id(stored: str) -> str | bytes:
    """A stored id read back from Redis, as it must be written to Redis again.

    The store's client reads bytes that are not UTF-8 (a damaged id) as lone surrogates;
    those ids go back as the exact bytes they were.
    """
    return stored if stored.isascii() else stored.encode("utf-8", "surrogateescape")


def digest(value: str) -> str:
    """The SHA-1 (hex) of a value read back from Redis, as a script's ``redis.sha1hex``
    gives it of the stored bytes ("" stays "": any value); a script compares that, so a
    long value is not sent back whole."""
    return value and hashlib.sha1(value.encode("utf-8", "surrogateescape"),
                                  usedforsecurity=False).hexdigest()


def unpack_id(stored: str) -> str:
    """The job id :func:`pack_id` stored as ``stored``.

    A damaged id that starts with one ``~`` but is not ``~`` and 21 base64url characters
    (no id packs to it) comes back as it is, as the claim script reads it too.
    """
    if not stored.startswith(PACKED):
        return stored
    if stored.startswith(PACKED * 2):
        return stored[1:]
    if not _PACKED_UUID.fullmatch(stored):
        return stored
    h = base64.urlsafe_b64decode(stored[1:] + "A==").hex()
    return f"{h[:8]}-{h[8:12]}-4{h[12:15]}-{h[15:19]}-{h[19:31]}"
