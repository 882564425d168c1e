"""The journal streams: worker-side events written, entries read (as the Django mirror and
the pytest plugin read them, or as stored for ``delayq export``), the export's positions
(the ``<prefix>:export`` hash) and its lock (``<prefix>:exporting``)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from itertools import chain
from typing import Any, cast

import redis

from ..connection import resend_window_ms
from ..keys import ShardKeys, pack_id
from ..reading import job_id_of
from ..scripts import SCRIPTS, execute
from .base import StoreBase

#: Stream entries as the store's client reads them: (entry id, fields).
Entries = list[tuple[str, dict[str, str]]]
#: An event to journal: (shard, event, fields).
JournalEntry = tuple[int, str, dict[str, Any]]
#: How long the export's lock lasts unless renewed (the export renews it at each batch).
EXPORT_LOCK_MS = 120_000


class Streams(StoreBase):
    """The journal streams of the shards."""

    def journal(self, shard: int, event: str, fields: dict[str, Any]) -> None:
        """Append one event to a shard's journal (worker-side events)."""
        self.journal_many([(shard, event, fields)])

    def journal_many(self, entries: list[JournalEntry], token: str | None = None
                     ) -> list[tuple[JournalEntry, Exception]]:
        """Append ``(shard, event, fields)`` entries to the journals in one round trip; those
        not written, each with why, the others written. Why: an entry no Redis command can
        carry (a job id that is not text, a field neither text nor a number, text that is
        not UTF-8) is not sent (``redis.DataError``); a refusal of Redis, of all the entries
        of a shard, is worded as
        :meth:`~celery_delayq.store.base.StoreBase.unavailable` words it:
        ``StoreUnavailable`` for one that lasts a while (a read-only replica, a failed RDB
        save, a slot moving...), ``StoreFull`` for memory, ``DamagedShard`` for a journal
        key of another type, else a ``DelayQError`` or Redis's own ``ResponseError``.
        Raises when the round trip failed (``StoreUnavailable``).

        ``token`` (:func:`batch_token`; a new one when None) names the batch: sent again
        with it, by redis-py (its reply lost) or by the caller (a write that failed), the
        entries of a shard that were written are not written again within
        ``connection.resend_window_ms`` (``worker_events-1+.lua``)."""
        if self._maxlen <= 0 or not entries:
            return []
        unsent: list[tuple[JournalEntry, Exception]] = []
        by_shard: dict[int, list[JournalEntry]] = {}  # the entries sent, by shard
        args: dict[int, list[Any]] = {}  # each shard's call's ARGV
        window = round(resend_window_ms(self.config))
        encode = self.client.get_encoder().encode
        for entry in entries:
            shard, event, fields = entry
            try:
                stored = _stored(encode, event, fields)
            except redis.DataError as exc:
                unsent.append((entry, exc))
                continue
            by_shard.setdefault(shard, []).append(entry)
            args.setdefault(shard, [self._maxlen, window]).extend(
                (len(stored), *chain.from_iterable(stored.items())))
        script, token = SCRIPTS["worker_events"], token or batch_token()
        calls = []
        for shard, shard_args in args.items():
            keys = self.keys.shard(shard)
            calls.append((script, script.keys_for(keys, self.keys.answer(keys, token)),
                          shard_args))
        with self.unavailable():
            replies = execute(self.client, calls, raise_errors=False) if calls else []
        return unsent + [(entry, self._refusal(reply))
                         for shard, reply in zip(args, replies, strict=True)
                         if isinstance(reply, Exception) for entry in by_shard[shard]]

    def _refusal(self, error: Exception) -> Exception:
        """A refusal of Redis as :meth:`unavailable` words it (one classification of what
        passes and what does not), or ``error`` itself when it does not word it."""
        try:
            with self.unavailable():
                raise error
        except Exception as exc:  # given back, not raised
            return exc

    def read_journal(self, shard: ShardKeys, after: str | None = None, until: str = "+",
                     count: int | None = None) -> Entries:
        """Journal entries of a shard after the entry id ``after`` (all when None).

        A ``job`` field that is not a stored job id is left out, and the field
        ``unreadable`` says so.
        """
        entries = self.journal_entries(shard, f"({after}" if after else "-", until, count)
        for _, fields in entries:
            if "job" in fields:
                job_id = job_id_of(fields["job"])
                if job_id is None:
                    del fields["job"]
                    fields["unreadable"] = "the job field is not a stored job id"
                else:
                    fields["job"] = job_id
        return entries

    def journal_entries(self, shard: ShardKeys, lower: str, upper: str,
                        count: int | None) -> Entries:
        """Up to ``count`` entries of a shard's stream from ``lower`` to ``upper``
        (``XRANGE`` bounds: ``(`` before an id excludes it), fields as stored."""
        with self.unavailable():
            return cast("Entries", self.client.xrange(shard.journal, lower, upper,
                                                      count=count))

    def journal_end(self, shard: ShardKeys) -> str | None:
        """The id of a shard's newest journal entry; None when the stream is empty."""
        with self.unavailable():
            end = cast("Entries", self.client.xrevrange(shard.journal, "+", "-", count=1))
        return end[0][0] if end else None

    def journal_lost_after(self, shard: ShardKeys, last: str) -> str | None:
        """Whether entries after ``last`` are gone from a shard's journal (trimmed by
        ``delayq_journal_maxlen``, or lost with Redis's data): the id up to which they
        are, else None. Gone when the oldest entry is past ``last`` and ``last`` is gone
        too, or when the stream is empty and an id past ``last`` was made. (Redis 7's
        ``max-deleted-entry-id`` cannot tell: XTRIM leaves it at 0-0.)

        ``last`` itself when the journal was made again below it (no id up to ``last``
        was made since: Redis lost the stream and its clock is behind the old one's):
        what followed ``last`` is gone, and the journal is to be read from its beginning."""
        with self.unavailable():
            try:
                info = self.client.xinfo_stream(shard.journal)
            except redis.ResponseError as exc:
                if "no such key" in str(exc):  # nothing journaled since Redis lost its data
                    return None
                raise
            made = info["last-generated-id"]
            if id_order(made) < id_order(last):
                return last
            first = info.get("first-entry")
            if not first:
                return made if id_order(made) > id_order(last) else None
            if id_order(first[0]) > id_order(last) and not self.client.xrange(
                    shard.journal, last, last):
                return cast("str", first[0])
            return None

    def export_positions(self) -> dict[str, str]:
        """Each shard's (as text) last exported entry id."""
        with self.unavailable():
            return cast("dict[str, str]", self.client.hgetall(self.keys.export_position))

    def save_export_position(self, shard: ShardKeys, entry_id: str,
                             back_from: str | None = None) -> None:
        """Remember that a shard's stream is exported up to ``entry_id``: forward only (a
        stalled export's older position is not saved over a later one), or back from
        ``back_from`` exactly (a journal made again below it: ``journal_lost_after``)."""
        with self.unavailable():
            SCRIPTS["export_forward"].call(self.client, [self.keys.export_position],
                          [str(shard.shard), entry_id, back_from or ""])

    def export_token(self) -> str:
        """A new value of the export's lock: when (Redis's clock, ms), where, and a random
        part."""
        with self.unavailable():
            now = self.now_ms()
        return f"{now} {socket.gethostname()}:{os.getpid()} {os.urandom(6).hex()}"

    def take_export_lock(self, token: str) -> str | None:
        """Take the export's lock (one export at a time) for :data:`EXPORT_LOCK_MS`, as
        ``token`` (:meth:`export_token`): None when taken, else the holder's token ("" if
        it just went)."""
        with self.unavailable():
            if SCRIPTS["own"].call(self.client, [self.keys.export_lock],
                                   [token, EXPORT_LOCK_MS, "1"]):
                return None
            return cast("str | None", self.client.get(self.keys.export_lock)) or ""

    def renew_export_lock(self, token: str) -> bool:
        """Hold the lock ``token`` took for :data:`EXPORT_LOCK_MS` more; False when it was
        lost meanwhile (it expired, another export may have taken it)."""
        with self.unavailable():
            return (self.client.get(self.keys.export_lock) == token
                    and bool(SCRIPTS["own"].call(self.client, [self.keys.export_lock],
                                                 [token, EXPORT_LOCK_MS, "1"])))

    def release_export_lock(self, token: str) -> None:
        """Release the lock, if ``token`` still holds it."""
        with self.unavailable():
            SCRIPTS["own"].call(self.client, [self.keys.export_lock],
                                [token, EXPORT_LOCK_MS, "0"])


def batch_token() -> str:
    """A new token for a batch of worker events (:meth:`Streams.journal_many`)."""
    return os.urandom(9).hex()


def _stored(encode: Callable[[Any], Any], event: str, fields: dict[str, Any]
            ) -> dict[Any, Any]:  # (xadd's Dict is invariant)
    """The fields of a journal entry as Redis gets them (its job id packed), encoded by the
    client's ``encode``; ``redis.DataError`` naming the field that no command can carry."""
    job = fields.get("job")
    if "job" in fields:
        if not isinstance(job, str):
            raise redis.DataError(f"its job id is a {type(job).__name__}, not text")
        fields = {**fields, "job": pack_id(job)}
    stored: dict[Any, Any] = {}
    for name, value in (("event", event), *fields.items()):
        try:
            stored[encode(name)] = encode(value)
        except (redis.DataError, UnicodeError, TypeError, ValueError) as exc:
            raise redis.DataError(f"its field {name!r} cannot be sent to Redis ({exc})"
                                  ) from exc
    return stored


def id_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id as it sorts."""
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)
