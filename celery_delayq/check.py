"""``delayq check [--repair]``: verify the store's invariants, report and repair damage.

The invariants (what the scripts keep true on every shard, and how ``counts`` and
``bykey`` are maintained) are written down once, in :mod:`keys` ("Invariants", 1-8 checked
here). An evicting Redis, a hand-edited key or a bug breaks them; this finds:

- ``dangling_due`` / ``dangling_inflight``: members without an envelope (1., 2.);
- ``orphaned``: envelopes in neither set (3.); jobs in both are counted, not repaired (4.);
- ``dangling_bykey``: index members whose job is gone or has another key (5.);
- ``counts``: a task's count that is not its number of envelopes (6.);
- ``dangling_kept``: envelopes kept for a copy in flight (8.) whose id has no lease;
- ``stranded``: held jobs (7.) that nothing in force holds: a job held by a pause whose
  task or queue the shard's ``paused`` hash no longer names, or one held by a rate limit
  whose queue has no limit in force in the shard's ``limits`` hash or whose ``waiting``
  member is gone. No room in a bucket would ever release it, only the release of a
  resume or a limit's removal still under way (``store/releasing.py``).

Each finding is checked again by ``repair-7.lua``, atomically, before it is reported, so a
job that changed under the scan (a store in use) is neither reported nor repaired; a
stranded job's, in one transaction with a WATCH of the shard's ``paused`` hash (read for
the finding), so the jobs of a pause made during the check are not stranded. Repair
(one call per finding): orphaned envelopes are dead-lettered with the reason
``orphaned: ...`` (listed by ``delayq ls --dead``, replayable), never deleted; dangling
``due``/``inflight``/``bykey`` members and kept envelopes are removed; counts get the
difference added; stranded jobs get their due time back (the next claim holds them again
if it must).

Everything is read in chunks (HSCAN/ZSCAN, pipelined lookups per chunk) and repaired chunk
by chunk, so a store of millions of jobs is never held in memory. A scan returns every
member that is there from its start to its end, however others come and go (held jobs
are looked at in the scan of ``due``, not read by rank, which shifts as a carrier claims).
Counts are compared only when nothing wrote to the shard's ``jobs`` or ``counts`` during
the scan: the newest entry of the shard's journal (every script that stores or forgets a
job journals there), the hash's length, the fields scanned and ``counts`` are the same
before and after. Otherwise, and always without a journal (``delayq_journal_maxlen = 0``),
they are reported as unchecked: run it again when quiet.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from redis.client import Pipeline
from redis.exceptions import NoScriptError, WatchError

from .decoding import first_line
from .errors import DamagedShard
from .held import split_score
from .keys import KEPT, ShardKeys, unpack_id
from .ratelimit import in_force
from .reading import MIN_MS, count_of
from .scripts import SCRIPTS, execute
from .store import Store
from .store.base import chunks

_CHUNK = 500
_EXAMPLES = 5
_ORPHANED = "orphaned: the envelope was in neither the due nor the in-flight set"
KINDS = ("dangling_due", "dangling_inflight", "orphaned", "dangling_bykey", "counts",
         "dangling_kept", "stranded")


@dataclass
class ShardReport:
    """What the check found on one shard (and repaired, with ``--repair``)."""

    shard: int
    found: Counter = field(default_factory=Counter)  # kind -> findings
    repaired: Counter = field(default_factory=Counter)  # kind -> repairs made
    examples: dict[str, list[str]] = field(default_factory=dict)  # kind -> a few ids
    jobs: int = 0
    in_both: int = 0  # legal: scheduled again while in flight
    counts_checked: bool = True
    error: str | None = None


def check(store: Store, repair: bool = False) -> list[ShardReport]:
    """Check every shard (and repair what it finds, when asked)."""
    return [_ShardCheck(store, shard, repair).run() for shard in store.keys]


class _ShardCheck:
    def __init__(self, store: Store, shard: ShardKeys, repair: bool) -> None:
        self.store, self.shard, self.repair = store, shard, repair
        self.client = store.client
        self.report = ShardReport(shard.shard)

    def run(self) -> ShardReport:
        try:
            with self.store.unavailable():
                self._jobs()
                for kind, key in (("dangling_due", self.shard.due),
                                  ("dangling_inflight", self.shard.inflight)):
                    self._members(kind, key)
                self._bykey()
        except (redis.ResponseError, DamagedShard) as exc:  # e.g. a key of the wrong type
            self.report.error = str(exc)
        return self.report

    def _jobs(self) -> None:
        shard, tasks, fields = self.shard, Counter[str](), 0
        journaled = self._journaled()
        before = self.client.hlen(shard.jobs)
        counts = self.client.hgetall(shard.counts)
        for chunk in chunks(self.client.hscan_iter(shard.jobs, count=_CHUNK), _CHUNK):
            names = [name for name, _ in chunk]
            kept = [name.removeprefix(KEPT) for name in names if name.startswith(KEPT)]
            pipe = self.client.pipeline(transaction=False)
            pipe.zmscore(shard.due, names)
            pipe.zmscore(shard.inflight, names)
            if kept:
                pipe.zmscore(shard.inflight, kept)  # the leases kept envelopes go with
            due, inflight, *leases = pipe.execute()
            leased = dict(zip(kept, leases[0], strict=True)) if kept else {}
            orphaned, loose = [], []
            for (name, envelope), in_due, in_flight in zip(chunk, due, inflight, strict=True):
                # an envelope kept for its lease, not a job (unless a job's own id, stored
                # before ids held no control character, begins as one: then it is on a set)
                if name.startswith(KEPT) and in_due is None and in_flight is None:
                    if leased[stored := name.removeprefix(KEPT)] is None:
                        loose.append(stored)
                    continue
                task = first_line(envelope).get("t")
                tasks[task if isinstance(task, str) else ""] += 1
                self.report.jobs += 1
                if in_due is None and in_flight is None:
                    orphaned.append(name)
                self.report.in_both += in_due is not None and in_flight is not None
            fields += len(chunk)
            self._found("orphaned", orphaned, [("orphan", s, _ORPHANED) for s in orphaned])
            self._found("dangling_kept", loose, [("kept", s, "") for s in loose])
        after = self.client.hlen(shard.jobs) + self.report.repaired["dangling_kept"]  # no job
        same = before == after == fields and self.client.hgetall(shard.counts) == counts
        quiet = same and journaled is not None and self._journaled() == journaled
        self._counts(tasks, cast("dict[str, str]", counts) if quiet else None)  # decoded

    def _journaled(self) -> str | None:
        """The id of the shard's newest journal entry ("" before the first), which every
        script that stores or forgets a job moves on; None without a journal."""
        if not self.store.config.journal_maxlen:
            return None
        return self.store.journal_end(self.shard) or ""

    def _counts(self, tasks: Counter[str], counts: dict[str, str] | None) -> None:
        """Compare the envelopes' tasks with ``counts`` (None: the scan cannot be trusted)."""
        if counts is None:
            self.report.counts_checked = False
            return
        # a damaged count (not an integer) is wrong whatever it should be; the repair's
        # add_count sets it to the difference from 0
        stored = {task: count_of(n) for task, n in counts.items() if task != ""}
        diffs = {task: tasks.get(task, 0) - (stored.get(task) or 0)
                 for task in set(tasks) | set(stored) if task != ""}
        wrong = sorted(task for task, diff in diffs.items()
                       if diff or (task in stored and stored[task] is None))
        self._found("counts", wrong, [("count", task, diffs[task]) for task in wrong])

    def _members(self, kind: str, key: str) -> None:
        """Members of ``due`` or ``inflight`` without an envelope; in ``due``, stranded jobs."""
        # a lease still running may have lost its envelope to a move (keys.py, 2.)
        live = self.store.now_ms() if kind == "dangling_inflight" else float("inf")
        for chunk in chunks(self.client.zscan_iter(key, count=_CHUNK), _CHUNK):
            ids = [member for member, score in chunk if score < live]
            pipe = self.client.pipeline(transaction=False)
            for stored in ids:
                pipe.hexists(self.shard.jobs, stored)
            missing = [s for s, held in zip(ids, pipe.execute(), strict=True) if not held]
            what = kind.removeprefix("dangling_")
            self._found(kind, missing, [(what, s, "") for s in missing])
            if kind == "dangling_due":
                on_hold = [(stored, score) for stored, score in chunk if split_score(score)[1]]
                if on_hold:
                    self._held(on_hold)

    def _bykey(self) -> None:
        for chunk in chunks(self.client.zscan_iter(self.shard.bykey, count=_CHUNK), _CHUNK):
            members = [member for member, _ in chunk]
            parts = [member.partition("\x00") for member in members]
            envelopes = cast("list[str | None]", self.client.hmget(
                self.shard.jobs, [stored for _, _, stored in parts]))
            wrong = [member for member, (key, _, _), envelope
                     in zip(members, parts, envelopes, strict=True)
                     if envelope is None or first_line(envelope).get("y") != key]
            self._found("dangling_bykey", wrong, [("bykey", m, "") for m in wrong])

    def _held(self, held: list[tuple[str, float]]) -> None:
        """Report (and repair) the stranded jobs among ``held``: the shard's pauses are
        read under WATCH and the findings checked again in one transaction with it, so a
        pause or resume made in between has the chunk looked at again."""
        while True:
            with self.client.pipeline(transaction=True) as watching:
                watching.watch(self.shard.paused)
                stranded = self._stranded(held)
                try:
                    self._found("stranded", [stored for stored, _ in stranded],
                                [("held", stored, repr(score)) for stored, score in stranded],
                                watching)
                    return
                except WatchError:
                    continue
                except NoScriptError:  # Redis forgot it: the transaction ran nothing
                    self.client.script_load(SCRIPTS["repair"].source)

    def _stranded(self, held: list[tuple[str, float]]) -> list[tuple[str, float]]:
        """The held jobs of a chunk of ``due`` that nothing in force holds (7. above)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.shard.jobs, [stored for stored, _ in held])
        pipe.hkeys(self.shard.paused)
        pipe.hgetall(self.shard.limits)
        envelopes, paused, limits = cast("tuple[list[str | None], list[str], dict[str, str]]",
                                         pipe.execute())
        limited = {name.removeprefix("rate:") for name, value in limits.items()
                   if name.startswith("rate:") and in_force(value)}
        stranded, waiting = [], {}  # (stored, score) -> its member in ``waiting``
        for (stored, score), envelope in zip(held, envelopes, strict=True):
            if envelope is None:
                continue  # a dangling due member, found above
            fields = first_line(envelope)
            task, queue = fields.get("t"), fields.get("q")
            if not isinstance(queue, str) or not queue:
                queue = self.store.config.default_queue
            due, why = cast("tuple[float, str]", split_score(score))
            if why == "paused":
                if not ((isinstance(task, str) and f"task:{task}" in paused)
                        or f"queue:{queue}" in paused):
                    stranded.append((stored, score))
            elif queue not in limited:
                stranded.append((stored, score))
            else:  # as held.lua's waiting_member writes it
                waiting[stored, score] = f"{queue}\x00{due - MIN_MS:019.3f}\x00{stored}"
        if waiting:
            found = self.client.zmscore(self.shard.waiting, list(waiting.values()))
            stranded += [job for job, at in zip(waiting, found, strict=True) if at is None]
        return stranded

    def _found(self, kind: str, items: list[str], repairs: list[tuple[str, str, Any]],
               watching: Pipeline | None = None) -> None:
        """Report (and repair) the findings that still hold when looked at again (in
        ``watching``'s transaction, when given: WatchError if a watched key changed)."""
        if not items:
            return
        calls = [(SCRIPTS["repair"], SCRIPTS["repair"].keys_for(self.shard),
                  [self.store.config.journal_maxlen, what, value, extra,
                   "" if self.repair else "1"]) for what, value, extra in repairs]
        if watching is None:
            replies = execute(self.client, calls)
        else:
            watching.multi()
            for script, keys, args in calls:
                script.queue(watching, keys, args)
            replies = watching.execute()
        held = [item for item, done in zip(items, replies, strict=True) if done]
        if not held:
            return
        self.report.found[kind] += len(held)
        examples = self.report.examples.setdefault(kind, [])
        examples.extend(_shown(kind, item) for item in held[:_EXAMPLES - len(examples)])
        if self.repair:
            self.report.repaired[kind] += len(held)


def _shown(kind: str, item: str) -> str:
    """A finding as printed: job ids unpacked, bykey members as key/id."""
    if kind == "counts":
        return item
    if kind == "dangling_bykey":
        key, _, stored = item.partition("\x00")
        return f"{key!r}/{unpack_id(stored)}"
    return unpack_id(item)
