"""The producers' writes: schedule, cancel, reschedule, each made of script calls
(``scripts/``), one per shard; a look for a job id on every shard holds the id's reservation
(:mod:`reservation`) until the write is made."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from typing import Any, NamedTuple, cast

import redis

from ..connection import redact, resend_window_ms
from ..decoding import first_line
from ..envelope import Call
from ..errors import DelayQError, InvalidOption, StoreFull, StoreUnavailable
from ..held import split_score
from ..keys import KEPT, ShardKeys, bykey_member, pack_id, unpack_id
from ..memory import refused_for_memory
from ..reading import counted
from ..reservation import Reservation, reserving, reserving_ids
from ..scripts import SCRIPTS, Script, execute
from ..validation import Due
from .base import StoreBase, raised

_logger = logging.getLogger(__package__)  # celery_delayq.store
_SCHEDULE_CHUNK = 1000  # jobs per schedule script call
#: How long a run's outcome (``RunRows``) is kept after its last write, unless forgotten.
OUTCOME_MS = 24 * 3600 * 1000
#: Jobs of a business key one cancel script call looks at (``cancel_key``): ~12 ms of Redis.
CANCEL_KEY_CHUNK = 1000
#: How long a job's task id index (keys.py) outlives its due time: a job pending that much
#: past due (no carrier running) is no longer found by its task id, only by its job id.
TASK_INDEX_GRACE_MS = 24 * 3600 * 1000


#: About what Redis holds for one recorded revoke (a key with an expiry).
_REVOKED_BYTES = 150


class CancelOutcome(str, Enum):
    """What a cancel by job id found."""

    CANCELLED = "cancelled"
    TOO_LATE = "too late: already promoted"
    UNKNOWN = "unknown"


class Cancelled(NamedTuple):
    """What :meth:`Producing.cancel` did, and the Celery task id and task name of the job
    it cancelled (None when it cancelled none)."""

    outcome: CancelOutcome
    task_id: str | None = None
    task: str | None = None


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
    due_ms: int | None  # None when a kept job is not pending (being promoted)
    existing: str | None  # the stored envelope when the job was kept


class Producing(StoreBase):
    """The writes of producers (the Python API, the CLI, the admin, Spark)."""

    # -- scheduling --------------------------------------------------------------------

    def schedule(self, items: list[tuple[Call, Due]], if_exists: str,
                 rows: RunRows | None = None) -> list[Scheduled]:
        """Store calls: one script call per shard and batch, in one round trip.

        ``if_exists``: keep, replace or error, or ``retry`` (a running task's own retry):
        replace a stored call of the same task id, keep one of another (a newer call of
        the job id, scheduled while the run executed).

        ``rows`` names the items as input rows of a run: a row is written at most once in
        the run, however often its call is made again (a retried Spark task, a recomputed
        partition), which then answers the first outcome (no due time).

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
            call = items[index][0]
            # None when it went meanwhile (promoted): then it is scheduled here
            existing = None if if_exists == "replace" else self._existing(found, call,
                                                                          if_exists)
            if if_exists == "replace" or (if_exists == "retry" and existing is not None
                                          and _task_id_of(existing, call) == call.task_id):
                moved[index] = found
            else:
                results[index] = existing
        by_shard: dict[ShardKeys, list[int]] = defaultdict(list)
        for index, (call, _) in enumerate(items):
            if results[index] is None:
                by_shard[self.keys.shard_for(call.job_id, call.key)].append(index)
        calls, owners = [], []
        for shard, indexes in by_shard.items():
            for start in range(0, len(indexes), _SCHEDULE_CHUNK):
                chunk = indexes[start:start + _SCHEDULE_CHUNK]
                keys = SCRIPTS["schedule"].keys_for(
                    shard, *([] if rows is None else [self.keys.outcome(shard, rows.run)]))
                answer = rows is None and self._due_before_a_resend(items, chunk)
                if answer:
                    keys.append(self.answer_key(shard))
                args: list[Any] = [self._maxlen, if_exists, self.keys.wake_channel, shard.shard,
                                   OUTCOME_MS if rows is not None else 0, TASK_INDEX_GRACE_MS,
                                   len(keys) if answer else 0, round(self._resend_window_ms)]
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
                owners.append((shard, chunk))
        with self.unavailable():  # a job moved from another shard leaves it before the release
            replies = reservation.run(calls) if moved else reservation.release_after(calls)
        stored = [index for (_, chunk), reply in zip(owners, replies, strict=True)
                  if not isinstance(reply, Exception)
                  for offset, index in enumerate(chunk) if reply[3 * offset] in (1, 2)]
        for index in stored:  # the new copy is stored: the old one goes
            if index in moved:
                cancelled = self._cancel(moved[index], "move", items[index][0].job_id,
                                         "replaced under another key", "")
                if cancelled[1]:
                    self._forget_task_indexes(moved[index],
                                              [(items[index][0].stored_id, cancelled[2])])
        failed = next((reply for reply in replies if isinstance(reply, Exception)), None)
        if failed is not None:
            self._refuse(failed, [items[index][0].job_id for index in stored])
        replaced: dict[ShardKeys, list[tuple[str, str]]] = defaultdict(list)
        for (shard, chunk), reply in zip(owners, replies, strict=True):
            for offset, index in enumerate(chunk):
                code, score, existing = reply[3 * offset:3 * offset + 3]
                due_ms = split_score(score)[0]
                if code == ScheduleCode.CONFLICT and existing == items[index][0].envelope:
                    # this very call, stored by a run whose reply came too late (redis-py
                    # sent it again): its task id, drawn per call unless the caller fixes
                    # it, makes an envelope one call's own
                    code = ScheduleCode.CREATED
                elif code == ScheduleCode.REPLACED:
                    call = items[index][0]
                    if existing and existing != call.task_id:  # the replaced job's task id
                        replaced[shard].append((call.stored_id, existing))  # (a retry's own)
                    existing = None
                results[index] = Scheduled(_CODES[code], _whole(due_ms), existing)
        self._unindex(replaced)
        return cast("list[Scheduled]", results)  # every item has its outcome now

    def _unindex(self, replaced: dict[ShardKeys, list[tuple[str, str]]]) -> None:
        """Forget the task id indexes of jobs that no longer have those task ids (stored
        job id, task id): calls a schedule replaced under new task ids, cancelled jobs.
        Each would stay a day past its due time. One call per shard, one round trip."""
        if replaced:
            with self._tidying(sum(map(len, replaced.values()))):
                execute(self.client, [self.unindex_call(shard, jobs)
                                      for shard, jobs in replaced.items()])

    @contextlib.contextmanager
    def _tidying(self, jobs: int) -> Iterator[None]:
        """Forget task id indexes after a write that was made: a failure is logged, not
        raised (each expires a day after its job's due time), or the caller would take
        the write for failed, and a task's retry that was stored for a failed one."""
        try:
            with self.unavailable():
                yield
        except DelayQError as exc:
            _logger.warning("could not forget the task id index of %s (each expires a day "
                            "after its job's due time): %s", counted(jobs, "job"), exc)

    @cached_property
    def _resend_window_ms(self) -> float:
        return resend_window_ms(self.config)

    def _due_before_a_resend(self, items: list[tuple[Call, Due]], chunk: list[int]) -> bool:
        """Whether a job of ``chunk`` may be due (and so published, and gone from the
        store) before redis-py sends the call again, its reply lost: such a call keeps its
        reply for its second run, which writes nothing. Later jobs are still pending then:
        the second run finds its own write and answers alike."""
        now_ms = time.time() * 1000
        window = self._resend_window_ms
        for index in chunk:
            due = items[index][1]
            if ((due.delay_ms or 0) if due.at_ms is None else due.at_ms - now_ms) < window:
                return True
        return False

    def forget_run(self, run: str) -> None:
        """Drop a finished run's outcome (``RunRows``); it would expire by itself."""
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            for shard in self.keys:
                pipe.unlink(self.keys.outcome(shard, run))  # freed in the background
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
                calls.append((SCRIPTS["exists"], SCRIPTS["exists"].keys_for(shard),
                              [items[index][0].stored_id for index in chunk]))
                owners.append((shard, chunk))
        if not calls:
            return {}
        with self.unavailable():
            replies = raised(reservation.take_then(calls))
        elsewhere: dict[int, ShardKeys] = {}
        for (shard, chunk), found in zip(owners, replies, strict=True):
            for index, hit in zip(chunk, found, strict=True):
                if hit == "1":
                    elsewhere.setdefault(index, shard)
        return elsewhere

    def _existing(self, shard: ShardKeys, call: Call, if_exists: str) -> Scheduled | None:
        """What ``keep`` / ``error`` (``retry``: keep) answer for a job stored on another
        shard; None when it is gone."""
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            pipe.hget(shard.jobs, call.stored_id)
            pipe.zscore(shard.due, call.stored_id)
            envelope, score = pipe.execute()
        if envelope is None:
            return None
        code = ScheduleCode.CONFLICT if if_exists == "error" else ScheduleCode.KEPT
        due_ms = split_score(score)[0]
        return Scheduled(code, _whole(due_ms), envelope)

    def _refuse(self, failed: Exception, stored: list[str]) -> None:
        """Raise a failed schedule call's error; each call is atomic (a script refused for
        memory, or on a cluster slot being moved, wrote nothing), so ``stored`` (written by
        the calls that ran) is exact."""
        if isinstance(failed, redis.ResponseError) and refused_for_memory(failed):
            self.headroom.refused()
            raise StoreFull(f"Redis at {redact(self.config.redis_url)} refused a write: it is "
                            "at its maxmemory", stored) from failed
        try:
            with self.unavailable():
                raise failed
        except StoreUnavailable as exc:
            if not stored:
                raise
            raise StoreUnavailable(str(exc), stored) from exc.__cause__

    # -- cancel and reschedule ---------------------------------------------------------

    def cancel(self, job_id: str, by: str = "", task_id: str = "") -> Cancelled:
        """Cancel a pending job; the outcome says whether anything of that id will run.

        A job id names one job whatever its business key, so every shard is looked at,
        and a copy stored under another key (two producers racing before reservations) is
        cancelled as well. The id's reservation is held from that look to the cancel
        (:meth:`_shards_holding`). With ``task_id``, only a job of that Celery task id is
        cancelled.
        """
        with self._reserving_id(job_id) as reservation:
            shards = self._shards_holding(reservation, job_id, in_flight=True)
            with self.unavailable():  # the release rides along on one server
                replies = raised(reservation.release_after(
                    [self._cancel_call(shard, "id", job_id, by, task_id) for shard in shards]))
        for shard, reply in zip(shards, replies, strict=True):
            if reply[1]:
                self._forget_task_indexes(shard, [(pack_id(job_id), reply[2])])
        codes = {reply[0] for reply in replies}
        if 0 in codes:  # a carrier holds a copy: it will be delivered
            outcome = CancelOutcome.TOO_LATE
        else:
            outcome = CancelOutcome.CANCELLED if 1 in codes else CancelOutcome.UNKNOWN
        cancelled = next((reply for reply in replies if reply[1]), None)
        if cancelled is None:
            return Cancelled(outcome)
        return Cancelled(outcome, cancelled[2] or job_id, cancelled[3])

    def cancel_key(self, key: str, by: str = "") -> list[tuple[str, str]]:
        """Cancel every pending job with this business key; returns the task id and task
        name of each (:meth:`cancel_key_chunks`, all at once)."""
        return [job for chunk in self.cancel_key_chunks(key, by) for job in chunk]

    def cancel_key_chunks(self, key: str, by: str = "") -> Iterator[list[tuple[str, str]]]:
        """Cancel every pending job with this business key, yielding the task id and task
        name of each chunk's jobs as soon as that chunk is cancelled.

        One script call per :data:`CANCEL_KEY_CHUNK` jobs of the key, each atomic against
        the carrier: a key with very many jobs never blocks Redis for long (one call for
        200,000 jobs held it for 2.5 s). A job scheduled with the key while the calls run
        may be cancelled too, or not.
        """
        shard, after = self.keys.shard_for("", key), ""
        while True:
            reply = self._cancel(shard, "key", key, by, after, CANCEL_KEY_CHUNK)
            self._forget_task_indexes(shard, list(zip(reply[3::3], reply[2::3], strict=True)))
            yield [(task_id or unpack_id(job_id), task) for task_id, job_id, task in zip(
                reply[2::3], reply[3::3], reply[4::3], strict=True)]
            after = reply[0]
            if not after:
                return

    def cancel_task(self, task_id: str, by: str = "") -> Cancelled:
        """Cancel the pending job of a Celery task id: the job of that id, else the job
        its task id index names (a job scheduled with an id of its own)."""
        cancelled = self.cancel(task_id, by=by)
        if cancelled.outcome is not CancelOutcome.UNKNOWN:
            return cancelled
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            for shard in self.keys:
                pipe.get(self.keys.task_index(shard, pack_id(task_id)))
            job_ids = {unpack_id(stored) for stored in pipe.execute() if stored is not None}
        for job_id in job_ids:  # one, unless its job moved to another key's shard
            cancelled = self.cancel(job_id, by=by, task_id=task_id)
            if cancelled.outcome is not CancelOutcome.UNKNOWN:
                return cancelled
        return Cancelled(CancelOutcome.UNKNOWN)

    def remember_revoked(self, task_ids: list[str], seconds: float) -> None:
        """Record for ``seconds`` that these Celery task ids were revoked (see
        :meth:`revoked`); :class:`StoreFull`, writing nothing, past
        ``delayq_max_memory_fraction`` (a revoke must not fill the broker's Redis)."""
        with self.unavailable():
            self.headroom.check(len(task_ids) * _REVOKED_BYTES)
            pipe = self.client.pipeline(transaction=False)
            for task_id in task_ids:
                pipe.set(self.keys.revoked(task_id), "1", px=max(round(seconds * 1000), 1))
            pipe.execute()

    def revoked(self, task_id: str) -> bool:
        """Whether a revoke of ``task_id`` was recorded (:meth:`remember_revoked`) and has
        not expired."""
        with self.unavailable():
            return self.client.get(self.keys.revoked(task_id)) is not None

    def _forget_task_indexes(self, shard: ShardKeys, jobs: list[tuple[str, str]]) -> None:
        """Forget the task id indexes of these cancelled jobs (stored job id, task id; "":
        the job id, no index): only a pending job is found by its task id, and each would
        stay a day. Through ``unindex``: a call stored again meanwhile keeps its index."""
        indexed = [(stored, task_id) for stored, task_id in jobs if task_id]
        if indexed:
            self._unindex({shard: indexed})

    def _cancel(self, shard: ShardKeys, kind: str, value: str, by: str,
                *more: str | int) -> list[Any]:
        """Run one call of the cancel script (:meth:`_cancel_call`)."""
        script, keys, args = self._cancel_call(shard, kind, value, by, *more)
        with self.unavailable():
            return script.call(self.client, keys, args)

    def _cancel_call(self, shard: ShardKeys, kind: str, value: str, by: str,
                     *more: str | int) -> tuple[Script, list[str], list[Any]]:
        """A call of the cancel script on ``shard``; ``more``: its ARGV past the fourth."""
        script = SCRIPTS["cancel"]
        return (script, script.keys_for(shard, self.answer_key(shard)),
                [self._maxlen, kind, value if kind == "key" else pack_id(value), by, *more])

    def reschedule(self, job_id: str, due: Due, key: str | None = None) -> int | None:
        """Move a pending job to a new due time; returns it (ms) or None if not pending.

        It is looked for on the shard of ``key`` (without one, of its id) first; when not
        there, on every shard, holding the id's reservation (:meth:`_shards_holding`).
        """
        due_ms = self._reschedule_on(self.keys.shard_for(job_id, key), job_id, due)
        if due_ms is None:
            with self._reserving_id(job_id) as reservation:
                for shard in self._shards_holding(reservation, job_id):
                    due_ms = self._reschedule_on(shard, job_id, due)
                    if due_ms is not None:
                        break
        return due_ms

    def _reschedule_on(self, shard: ShardKeys, job_id: str, due: Due) -> int | None:
        """The reschedule script on ``shard``: the new due time (ms), None if the job is not
        pending there. A job with a task id of its own takes a second call, which names its
        task id index, so the script moves that index's expiry too."""
        script, guess = SCRIPTS["reschedule"], ""  # the job's task id ("": its job id)
        while True:
            index = [self.keys.task_index(shard, pack_id(guess))] if guess else []
            with self.unavailable():
                code, due_ms, task_id = script.call(
                    self.client, script.keys_for(shard, *index),
                    [self._maxlen, pack_id(job_id), *due.script_args(), self.keys.wake_channel,
                     shard.shard, guess, TASK_INDEX_GRACE_MS])
            if code != -1:
                return due_ms if code == 1 else None
            guess = task_id  # its task id is another: call again, naming its index

    def _reserving_id(self, job_id: str) -> Reservation:
        """The reservation of ``job_id`` its producers take (:mod:`reservation`)."""
        return reserving_ids(self.client, self.keys, [(job_id, pack_id(job_id))])

    def _shards_holding(self, reservation: Reservation, job_id: str,
                        in_flight: bool = False) -> list[ShardKeys]:
        """Shards whose job hash holds ``job_id`` (with ``in_flight``: or the envelope a
        carrier holds of a copy that moved to another shard meanwhile, kept.lua), looked at
        once ``reservation`` is taken: until it is released, no producer or replay moves
        the job, so a copy is where this look found it (or gone: a carrier's ack). One
        ``exists`` call per shard, riding with the take on one server. A Redis too full to
        take it looks unreserved: a cancel must free memory there."""
        stored = pack_id(job_id)
        ids = [stored, KEPT + stored] if in_flight else [stored]
        script = SCRIPTS["exists"]
        calls = [(script, script.keys_for(shard), ids) for shard in self.keys]
        with self.unavailable():
            found = raised(reservation.take_then(calls, unless_full=True))
        return [shard for shard, hits in zip(self.keys, found, strict=True) if "1" in hits]


def _task_id_of(existing: Scheduled, call: Call) -> str:
    """The task id of the call ``existing`` found stored under ``call``'s job id: its
    ``i``, else the job id; ``call``'s own when its first line cannot be read or its ``i``
    is no text (as the schedule script reads it)."""
    fields = first_line(existing.existing)
    task_id = fields.get("i", call.job_id)
    return task_id if fields and isinstance(task_id, str) else call.task_id


def _whole(due_ms: float | None) -> int | None:
    """A due time in whole ms, None for none."""
    return None if due_ms is None else int(due_ms)
