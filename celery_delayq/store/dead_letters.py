"""What an operator does with dead letters: replay them (due now) or drop them for good,
one by id or all of them (of a task, of a reason) a chunk at a time."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from ..decoding import first_line
from ..errors import JobExists, PayloadError
from ..keys import ShardKeys, digest, pack_id, raw_id, unpack_id
from ..reading import is_text
from ..reservation import Reservation, reserving_ids
from ..scripts import SCRIPTS
from .base import SCAN_CHUNK, StoreBase, chunks, raised

#: Dead letters read per round trip by ``replay_dead`` and ``drop_dead``.
DEAD_CHUNK = 500

Progress = Callable[[int], None]


class Replayed(NamedTuple):
    """What :meth:`DeadLetters.replay_dead` did with the dead letters it selected."""

    replayed: int
    live: int  # kept dead: a live job has the id (replay it once that job is gone)
    unreadable: int  # kept dead: no envelope in it to replay (``delayq ls --dead``)


class DeadLetters(StoreBase):
    """Replay and drop dead letters."""

    def replay(self, job_id: str, envelope: str = "") -> bool:
        """Put a dead-lettered job back, due now (optionally with a fixed envelope); False
        when no job of this id is dead, :class:`JobExists` when a live one has its id (on
        any shard), :class:`PayloadError` when the dead letter holds no envelope to put back
        and none is given."""
        stored = pack_id(job_id)
        dead = self._dead_shards(stored)
        if not dead:
            return False
        code = self._replay_unless_live(dead[0], [(stored, "")], envelope)[0]
        if code == -1:
            raise JobExists(job_id)
        if isinstance(code, list):  # [-2, why]
            raise PayloadError(
                f"dead letter {job_id!r} cannot be replayed: {code[1]}; `delayq ls --dead` "
                "shows it as stored. It stays dead: replay it with a fixed envelope "
                "(store.replay(job_id, envelope=...)) or drop it (`delayq drop`)")
        return code == 1

    def replay_dead(self, *, task: str | None = None, reason: str | None = None,
                    progress: Progress | None = None) -> Replayed:
        """Put back, due now, every dead letter of ``task`` whose reason contains
        ``reason`` (both optional), :data:`DEAD_CHUNK` per round trip, ``progress`` given
        the running count after each. A letter whose id a live job has, or that holds no
        envelope, stays dead and is counted; one written again since it was read is left."""
        replayed = live = unreadable = 0
        for shard, letters in self._dead_letters():
            picked = [(letter, _selected(letter[1], task, reason)) for letter in letters]
            unreadable += sum(1 for _, fit in picked if fit is None)
            codes = self._replay_unless_live(shard, [letter for letter, fit in picked if fit])
            replayed += codes.count(1)
            live += codes.count(-1)
            unreadable += sum(isinstance(code, list) for code in codes)
            if progress is not None:
                progress(replayed)
        return Replayed(replayed, live, unreadable)

    def drop(self, job_id: str, by: str) -> bool:
        """Give up a dead-lettered job for good, journaled as cancelled ``by``; False when
        no job of this id is dead."""
        stored = pack_id(job_id)
        return sum(self._drop_call(shard, [(stored, "")], by)
                   for shard in self._dead_shards(stored)) > 0

    def drop_dead(self, *, task: str | None = None, reason: str | None = None, by: str,
                  progress: Progress | None = None) -> int:
        """Give up for good every dead letter of ``task`` whose reason contains ``reason``
        (without either: every one, unreadable ones too), journaled as cancelled ``by``,
        :data:`DEAD_CHUNK` per round trip; returns how many, as ``progress`` is told. A
        letter written again since it was read is left."""
        dropped, every = 0, task is None and reason is None
        for shard, letters in self._dead_letters():
            dropped += self._drop_call(shard, [(stored, raw) for stored, raw in letters
                                               if every or _selected(raw, task, reason)], by)
            if progress is not None:
                progress(dropped)
        return dropped

    def _dead_letters(self) -> Iterator[tuple[ShardKeys, list[tuple[str, str]]]]:
        """Every shard's dead letters, (stored id, text) :data:`DEAD_CHUNK` at a time."""
        for shard in self.keys:
            with self.unavailable():
                letters = self.client.hscan_iter(shard.dead, count=SCAN_CHUNK)
                for chunk in chunks(letters, DEAD_CHUNK):
                    yield shard, chunk

    def _dead_shards(self, stored: str) -> list[ShardKeys]:
        """The shards whose dead letters hold this stored job id."""
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            for shard in self.keys:
                pipe.hexists(shard.dead, raw_id(stored))
            return [shard for shard, hit in zip(self.keys, pipe.execute(), strict=True) if hit]

    def _replay_unless_live(self, shard: ShardKeys, letters: list[tuple[str, str]],
                            envelope: str = "") -> list[Any]:
        """The replay script's code for each of these dead letters of ``shard`` ((stored id,
        letter as read or "" for any)), -1 for one whose id a live job has on another shard.
        Each id's reservation is held from that look to the replay, so a producer scheduling
        the id under another key meanwhile writes before or after it, and the later of the
        two sees the other's job. Three round trips on one server, four on a cluster."""
        if not letters:
            return []
        raw = [raw_id(stored) for stored, _ in letters]
        with self._reserving([stored for stored, _ in letters]) as reservation:
            with self.unavailable():
                found = raised(reservation.take_then(
                    [(SCRIPTS["exists"], SCRIPTS["exists"].keys_for(other), raw)
                     for other in self.keys if other is not shard]))
            live = [any(look[n] == "1" for look in found) for n in range(len(raw))]
            dead = [(one, read) for one, (_, read), held in zip(raw, letters, live, strict=True)
                    if not held]
            codes = iter(self._replay_calls(shard, dead, envelope, reservation))
        return [-1 if held else next(codes) for held in live]

    def _reserving(self, stored_ids: list[str]) -> Reservation:
        """The reservations of these ids, as producers take them (:mod:`reservation`); an
        id that is not text needs none: no producer can schedule it."""
        return reserving_ids(self.client, self.keys, (
            (unpack_id(stored), stored) for stored in stored_ids if is_text(stored)))

    def _replay_calls(self, shard: ShardKeys, letters: list[tuple[str | bytes, str]],
                      envelope: str, reservation: Reservation) -> list[Any]:
        """The replay script's code for each of these dead letters of ``shard`` (ids as
        :func:`raw_id` gives them, each with its letter as read or ""), in one round trip;
        ``reservation`` is released after it (not along: a replay Redis lacked the script of
        would run after the release)."""
        script = SCRIPTS["replay"]
        calls = [(script, script.keys_for(shard, self.answer_key(shard)),
                  [self._maxlen, raw, envelope, self.keys.wake_channel, shard.shard,
                   digest(read)])
                 for raw, read in letters]
        with self.unavailable():
            return raised(reservation.release_after(calls, along=False))

    def _drop_call(self, shard: ShardKeys, letters: list[tuple[str, str]], by: str) -> int:
        """Drop these dead letters of ``shard`` ((stored id, letter as read or "" for any))
        in one script call, each only while it is the letter read; how many were."""
        if not letters:
            return 0
        script = SCRIPTS["drop"]
        args = [value for stored, read in letters for value in (raw_id(stored), digest(read))]
        with self.unavailable():
            return int(script.call(self.client, script.keys_for(shard, self.answer_key(shard)),
                                   [self._maxlen, by, *args]))


def _selected(raw: str, task: str | None, reason: str | None) -> bool | None:
    """Whether a dead letter is of ``task`` and has ``reason`` in its reason; None when it
    holds no envelope (the replay script's own test)."""
    try:
        entry = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("envelope"), str):
        return None
    return (of_task_and_key(entry["envelope"], task)
            and (reason is None or reason in str(entry.get("reason", ""))))


def of_task_and_key(envelope: str, task: str | None, key: str | None = None) -> bool:
    """Whether a dead letter's envelope is of ``task`` and business ``key`` (None: any),
    as ``replay --all``, ``drop --all`` and ``ls --dead`` select them."""
    fields = first_line(envelope)
    return (task is None or fields.get("t") == task) and (key is None or fields.get("y") == key)
