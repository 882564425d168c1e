"""The store's reads: jobs by id, business key, task or argument; dead letters, per-shard
statistics and counts, pauses and rate limits, damaged keys, the journal. Plain commands,
pipelined across shards; values that may be odd are read through :mod:`reading`."""

from __future__ import annotations

import heapq
import json
import logging
import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, cast

from ..envelope import canonical_json
from ..held import NOT_HELD, RANGES, split_score
from ..job import Job
from ..keys import KEPT, KEY_TYPES, STORE_KEY_TYPES, ShardKeys, pack_id, raw_id
from ..reading import (
    MAX_MS,
    MIN_MS,
    Unreadable,
    count_of,
    datetime_of_ms,
    is_text,
    job_id_of,
    printable,
)
from .base import SCAN_CHUNK, StoreBase, chunks, damaged_key

_logger = logging.getLogger(__package__)  # celery_delayq.store
#: The largest stream entry id: a journal whose last id it is takes no more entries.
LAST_STREAM_ID = "18446744073709551615-18446744073709551615"


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


def _due_ms(score: float) -> float:
    """The due time of a ``due`` score, held or not (held.py)."""
    due = split_score(score)[0]
    return math.inf if due is None else due


def _by_due(job: Job) -> float:
    """A job's place in due order (one with no readable due time last)."""
    return job.due.timestamp() if job.due else math.inf


def _canonical(value: Any) -> str | None:
    """A stored argument value as canonical JSON; None for one JSON has no text for (NaN
    or Infinity planted by hand: producers refuse them)."""
    try:
        return canonical_json(value)
    except (TypeError, ValueError):
        return None


class Listing(StoreBase):
    """What the CLI, the admin, metrics and ``delayq sync`` read."""

    # -- jobs --------------------------------------------------------------------------

    def get(self, job_id: str, key: str | None = None) -> Job | None:
        """The stored job: pending (``scheduled``), else being promoted (``claimed``: a job
        moved to another key while in flight has both), else ``dead``. ``key`` says where
        to look first: a job stored under another key is found too, and found before a dead
        letter on the key's shard (one more round trip)."""
        if job_id.startswith(KEPT):  # a kept envelope's field (keys.py, 8.), never a job id
            return None
        if key:
            job = self._get(job_id, [self.keys.shard_for(job_id, key)])
            if job is not None and job.state != "dead":
                return job
        return self._get(job_id, list(self.keys))

    def _get(self, job_id: str, shards: list[ShardKeys]) -> Job | None:
        stored = pack_id(job_id)
        with self.unavailable():
            pipe = self.reader.pipeline(transaction=False)
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
        return heapq.nsmallest(limit, jobs, key=_by_due)

    def every_pending(self) -> Iterator[tuple[ShardKeys, list[Job]]]:
        """Every pending job (held ones too), a shard's due set read :data:`SCAN_CHUNK` at
        a time in no order (``ZSCAN``: a job moved meanwhile may come twice, or not at
        all). Jobs that cannot be read are left out, counted and logged once."""
        skipped, everything = Unreadable("pending jobs", _logger), _Wanted(None, None)
        for shard in self.keys:
            with self.unavailable():
                scan = self.reader.zscan_iter(shard.due, count=SCAN_CHUNK)
                for scored in chunks(scan, SCAN_CHUNK):
                    yield shard, self._jobs_of(shard, scored, everything, skipped)
        skipped.log()

    def _pending_in(self, shard: ShardKeys, wanted: _Wanted, key: str | None,
                    limit: int, skipped: Unreadable) -> list[Job]:
        if key:
            return self._pending_of_key(shard, key, wanted, limit, skipped)
        # each score range in due order, at most ``limit`` matches of each (pending()
        # merges them): the jobs held by a pause, by a rate limit (held.py), the others
        found: list[Job] = []
        ranges: list[tuple[float | str, float | str]] = [*RANGES.values(), *NOT_HELD]
        for low, high in ranges:
            matched: list[Job] = []
            start = 0
            while len(matched) < limit:
                chunk = cast("list[tuple[str, float]]", self.reader.zrangebyscore(
                    shard.due, low, high, start=start, num=SCAN_CHUNK, withscores=True))
                if not chunk:
                    break
                matched.extend(self._jobs_of(shard, chunk, wanted, skipped))
                start += SCAN_CHUNK
            found += matched[:limit]
        return found

    def _pending_of_key(self, shard: ShardKeys, key: str, wanted: _Wanted, limit: int,
                        skipped: Unreadable) -> list[Job]:
        """The ``limit`` earliest due pending jobs of a business key that ``wanted`` takes.
        Its index is read :data:`SCAN_CHUNK` members at a time (in job id order), so a key
        of very many jobs never holds Redis for long (one read of 200,000 took 170 ms);
        without a filter only the earliest ``limit`` jobs' envelopes are read."""
        filtered = wanted.task is not None or wanted.args_contains is not None
        low, high = f"[{key}\x00", f"({key}\x01"
        earliest: list[tuple[str, float]] = []
        found: list[Job] = []
        while True:
            members = cast("list[str]", self.reader.zrangebylex(  # decode_responses
                shard.bykey, low, high, start=0, num=SCAN_CHUNK))
            if not members:
                break
            low = f"({members[-1]}"
            ids = [m.partition("\x00")[2] for m in members]
            pipe = self.reader.pipeline(transaction=False)
            for stored in ids:
                pipe.zscore(shard.due, raw_id(stored))
            scored = [(i, s) for i, s in zip(ids, pipe.execute(), strict=True) if s is not None]
            if filtered:
                found = heapq.nsmallest(limit, found + self._jobs_of(
                    shard, scored, wanted, skipped), key=_by_due)
            else:
                earliest = heapq.nsmallest(limit, earliest + scored,
                                           key=lambda pair: _due_ms(pair[1]))
            if len(members) < SCAN_CHUNK:
                break
        return found if filtered else self._jobs_of(shard, earliest, wanted, skipped)

    def _jobs_of(self, shard: ShardKeys, scored: list[tuple[str, float]],
                 wanted: _Wanted, skipped: Unreadable) -> list[Job]:
        if not scored:
            return []
        raws = self.reader.hmget(shard.jobs, [raw_id(stored) for stored, _ in scored])
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
        skipped = Unreadable("dead letters", _logger)

        def every_letter() -> Iterator[dict[str, Any]]:
            for shard in self.keys:
                for stored, raw in self.reader.hscan_iter(shard.dead, count=SCAN_CHUNK):
                    entry, why = _dead_letter(stored, raw, shard.shard)
                    if why:
                        skipped.add(f"dead letter {stored!r} on shard {shard.shard}", why)
                    yield entry

        with self.unavailable():  # the newest only are kept while all are read
            newest = heapq.nlargest(limit, every_letter(),
                                    key=lambda e: (e["at"] is not None, e["at"] or 0))
        skipped.log()
        return newest

    def held(self, jobs: list[tuple[str, str | None]]) -> list[bool]:
        """For each (job id, business key): is the job stored, live or dead-lettered?"""
        with self.unavailable():
            pipe = self.reader.pipeline(transaction=False)
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
            raws = self.reader.hmget(shard.jobs, [pack_id(job_id) for job_id in job_ids])
        return dict(zip(job_ids, cast("list[str | None]", raws), strict=True))

    # -- the shards' state -------------------------------------------------------------

    def stats(self) -> list[dict[str, Any]]:
        """Per-shard counts: pending, overdue, paused and rate_limited (due jobs held by a
        pause or by their queue's rate limit: pending, not overdue), in flight, dead,
        journal length, next due, and ``unreadable_due``: pending jobs whose due score is
        no time (±inf, after the year 9999), which ``next_due_ms`` passes over.
        ``damaged`` says which key of the shard holds the wrong type ("" when none); its
        counts are 0 when that key is one they read.

        "Overdue" (due but not yet claimed) and ``now_ms`` follow Redis's clock.
        """
        with self.unavailable():
            now_ms = self.now_ms()
            pipe = self.reader.pipeline(transaction=False)
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
            self._ask_types(pipe)
            replies = pipe.execute(raise_on_error=False)
        damaged, exhausted = self._damaged(replies[-(len(KEY_TYPES) + 1) * self.keys.shards:])
        rows = []
        for shard in self.keys:
            shard_replies, replies = replies[:9], replies[9:]
            failed = any(isinstance(reply, Exception) for reply in shard_replies)
            pending, overdue, inflight, dead, journal, readable, head, paused, limited = (
                (0, 0, 0, 0, 0, 0, [], 0, 0) if failed else shard_replies)
            rows.append({
                "shard": shard.shard, "pending": pending, "overdue": overdue,
                "paused": paused, "rate_limited": limited, "inflight": inflight,
                "dead": dead, "journal": journal,
                "unreadable_due": pending - readable - paused - limited,
                "next_due_ms": int(head[0][1]) if head else None, "now_ms": now_ms,
                "damaged": damaged.get(shard.shard, ""),
                "journal_exhausted": shard.shard in exhausted,
            })
        return rows

    def earliest(self) -> tuple[int, str, ShardKeys] | None:
        """(due ms, job id, shard) of the first pending job whose due score is a time, or
        None."""
        with self.unavailable():
            pipe = self.reader.pipeline(transaction=False)
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
            pipe = self.reader.pipeline(transaction=False)
            for shard in self.keys:
                pipe.hgetall(shard.counts)
            per_shard = pipe.execute(raise_on_error=False)
        tasks: dict[str, int] = defaultdict(int)
        skipped = Unreadable("job counts", _logger)
        for shard, counts in zip(self.keys, per_shard, strict=True):
            if isinstance(counts, Exception):  # a damaged shard (stats() says which key)
                skipped.add(f"counts of shard {shard.shard}", str(counts))
                continue
            for task, text in counts.items():
                n = count_of(text)
                if is_text(task) and n is not None:
                    tasks[task] += n
                else:
                    skipped.add(f"count {task!r} on shard {shard.shard}", f"holds {text!r}")
        skipped.log()
        cancelled = tasks.pop("", 0)
        return {task: n for task, n in tasks.items() if n}, cancelled

    def _ask_types(self, pipe) -> None:
        """Queue a ``TYPE`` of every key of every shard and an ``XINFO STREAM`` of its
        journal (read by :meth:`_damaged`)."""
        for shard in self.keys:
            for name in KEY_TYPES:
                pipe.type(getattr(shard, name))
            pipe.xinfo_stream(shard.journal)

    def _damaged(self, replies: list[Any]) -> tuple[dict[int, str], set[int]]:
        """Shard -> its first key whose type (as :meth:`_ask_types` asked) is wrong; and
        the shards whose journal has no entry id left (journal.lua: their scripts go on
        without their events)."""
        damaged: dict[int, str] = {}
        exhausted: set[int] = set()
        names, asked = list(KEY_TYPES), len(KEY_TYPES) + 1
        for n, shard in enumerate(self.keys):
            *types, journal = replies[n * asked:(n + 1) * asked]
            for name, found in zip(names, types, strict=True):
                if found not in (KEY_TYPES[name], "none"):
                    damaged.setdefault(shard.shard, f"{getattr(shard, name)} holds a {found}, "
                                                    f"not a {KEY_TYPES[name]}")
            if (isinstance(journal, dict)  # (not an error: none, or damaged)
                    and journal.get("last-generated-id") == LAST_STREAM_ID):
                exhausted.add(shard.shard)
        return damaged, exhausted

    def damaged_store_keys(self) -> list[str]:
        """What is wrong with each store-wide key that holds the wrong type of value."""
        with self.unavailable():
            pipe = self.reader.pipeline(transaction=False)
            for name in STORE_KEY_TYPES:
                pipe.type(getattr(self.keys, name))
            found = pipe.execute()
        return [f"{getattr(self.keys, name)} holds a {kind}, not a {STORE_KEY_TYPES[name]}"
                for name, kind in zip(STORE_KEY_TYPES, found, strict=True)
                if kind not in (STORE_KEY_TYPES[name], "none")]

    def rate_limits(self) -> dict[str, str]:
        """Queue -> its ``limits`` hash value (the same on every shard): the first shard's
        whose key is not damaged (:class:`DamagedShard` when every one is)."""
        with self.unavailable():
            pipe = self.reader.pipeline(transaction=False)
            for shard in self.keys:
                pipe.hgetall(shard.limits)
            replies = pipe.execute(raise_on_error=False)
        found = next((cast("dict[str, str]", reply) for reply in replies
                      if not isinstance(reply, Exception)), None)
        if found is None:
            raise damaged_key(self.keys.shard(0).limits, "hash", replies[0])
        return {name.removeprefix("rate:"): value for name, value in found.items()
                if name.startswith("rate:")}

    def paused(self) -> set[str]:
        """The ``pausing.field`` of every pause (of any shard: one left by a pause that
        failed part way is listed too)."""
        with self.unavailable():
            pipe = self.reader.pipeline(transaction=False)
            for shard in self.keys:
                pipe.hkeys(shard.paused)
            return {name for names in pipe.execute() for name in names}


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
