"""One producer at a time per job id: reservations held while ids of the caller's own
choosing are scheduled, or their dead letters replayed.

A job lives on the shard of its business key, so one id given two keys could be written on
two shards by producers racing each other: each looks on the other shards for the id, finds
nothing yet, and writes its own copy. A producer therefore first takes a reservation of
each such id, a key on the id's own shard (``reserve-1+.lua``), and holds it until its
writes are done; the next producer of that id waits for it, then sees the copy it stored.
A replay of a dead letter holds its id's reservation in the same way, since it brings back
a job on the letter's shard, which need not be the shard a producer writes the id on.
A cancel or reschedule that looks for an id on every shard holds it too, so that a replace
moving the job to another shard comes before its look or after its write, never between.

On one Redis server the reservations ride in the round trips the producer makes anyway
(one connection keeps the order of a pipeline); on a cluster, whose nodes answer in any
order, they take a round trip each way of their own. A reservation ends by itself after
:data:`RESERVATION_MS`, should its producer die.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from .envelope import Call
from .errors import StoreUnavailable
from .keys import Keyspace, ShardKeys
from .memory import refused_for_memory
from .scripts import SCRIPTS, Script, execute

#: How long a reservation outlives a producer that never releases it, and how long a
#: producer waits for the ones it needs.
RESERVATION_MS = 10_000

Calls = list[tuple[Script, list[str], list[Any]]]


class Reservation:
    """The reservations of one schedule or replay call, taken and released around its calls;
    what is still held is released when its ``with`` block ends."""

    def __init__(self, client, groups: list[list[str]]) -> None:
        self._client, self._groups = client, groups  # reservation keys, one list per shard
        self._held = False
        if groups:  # else nothing is taken: the calls run as they are (the common case)
            self._token = os.urandom(12).hex()
            self._ordered = not isinstance(client, RedisCluster)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *_: object) -> None:
        """Release what may still be held (after a failed call, or a move); on a cluster
        each shard's on its own, so a node that cannot be reached does not keep the others'
        until they end by themselves (its own producer's retry would wait for them)."""
        if self._held:
            self._held = False
            releases = self._calls("release", self._groups)
            for calls in [releases] if self._ordered else [[call] for call in releases]:
                with contextlib.suppress(redis.RedisError):
                    self.run(calls)

    def take_then(self, calls: Calls, *, unless_full: bool = False) -> list[Any]:
        """Take the reservations, waiting for other producers', then run ``calls``;
        their replies, errors in place (``execute(raise_errors=False)``). With
        ``unless_full``, a Redis at its maxmemory, which refuses the take, runs the calls
        unreserved (a cancel frees memory; the producers' takes are refused too, so none
        writes the id meanwhile)."""
        deadline = time.monotonic() + RESERVATION_MS / 1000
        while self._groups:
            takes = self._calls("take", self._groups)
            self._held = True  # some may be, from here on (the release is the token's only)
            if self._ordered:
                replies = self._in_order(takes + calls)
                if replies is None:  # Redis lacked a script, loaded now: nothing kept
                    self.run(self._calls("release", self._groups))
                    continue
            else:
                replies = execute(self._client, takes, raise_errors=False)
            taken = replies[:len(takes)]
            if all(reply == 1 for reply in taken):
                if self._ordered:
                    return replies[len(takes):]
                break
            self.run(self._calls("release", [group for group, reply in zip(
                self._groups, taken, strict=True) if reply == 1]))
            failed = next((reply for reply in taken if isinstance(reply, Exception)), None)
            if failed is not None and unless_full and refused_for_memory(failed):
                self._held = False
                return replies[len(takes):] if self._ordered else self.run(calls)
            if failed is not None:  # e.g. refused for memory
                raise failed
            if time.monotonic() > deadline:
                raise StoreUnavailable(
                    f"other producers kept scheduling the same job ids for {RESERVATION_MS} "
                    f"ms (reservations such as {self._groups[0][0]!r}); retry the call")
            time.sleep(random.uniform(0.001, 0.005))  # the other producer writes meanwhile
        return self.run(calls)

    def release_after(self, calls: Calls, along: bool = True) -> list[Any]:
        """Run ``calls``, then release the reservations; the calls' replies as above. On
        one server the release rides in their round trip, where a call whose script Redis
        lacked runs again after it; ``along=False`` releases once their replies are in (a
        round trip more)."""
        if not self._held:
            return self.run(calls)
        self._held = False
        releases = self._calls("release", self._groups)
        if not (self._ordered and along):
            replies = self.run(calls)
            with contextlib.suppress(redis.RedisError):  # else they end by themselves
                self.run(releases)
            return replies
        return execute(self._client, calls + releases, raise_errors=False)[:len(calls)]

    def _in_order(self, calls: Calls) -> list[Any] | None:
        """On one server: ``calls`` in one pipeline, their replies (errors in place); None
        when Redis lacked the script of one (it forgets them when it restarts), loaded
        then. Such a call did not run, and would run again only after the calls behind it:
        a look before the take it needed. The pipeline also asks which other scripts Redis
        lacks, and those are loaded too: a write made under the reservations then never
        meets NOSCRIPT, which would run it after the release sent behind it."""
        pipe = self._client.pipeline(transaction=False)
        for script, keys, args in calls:
            script.queue(pipe, keys, args)
        pipe.script_exists(*(script.sha for script in SCRIPTS.values()))
        *replies, known = pipe.execute(raise_on_error=False)
        if isinstance(known, redis.ResponseError):  # an ACL of older docs: no script|exists
            known = [True] * len(SCRIPTS)  # (then only the calls' own NOSCRIPT is seen)
        missed = {script for (script, _, _), reply in zip(calls, replies, strict=True)
                  if isinstance(reply, NoScriptError)}
        lacked = missed | {script for script, there in zip(SCRIPTS.values(), known,
                                                             strict=True) if not there}
        for script in lacked:
            self._client.script_load(script.source)
        return None if missed else replies

    def _calls(self, action: str, groups: list[list[str]]) -> Calls:
        return [(SCRIPTS["reserve"], group, [action, self._token, RESERVATION_MS])
                for group in groups]

    def run(self, calls: Calls) -> list[Any]:
        """Run ``calls`` (the reservations stay as they are); their replies as above."""
        if len(calls) == 1:  # one round trip either way; a lone EVALSHA costs less
            script, keys, args = calls[0]
            try:
                return [script.call(self._client, keys, args)]
            except redis.ResponseError as exc:
                return [exc]
        return execute(self._client, calls, raise_errors=False) if calls else []


def reserving(client, keys: Keyspace, calls: list[Call]) -> Reservation:
    """A :class:`Reservation` of the calls' job ids that the caller chose (none with one
    shard, whose scripts see every copy), to use as a context manager."""
    return reserving_ids(client, keys, ((call.job_id, call.stored_id) for call in calls
                                        if not call.drawn))  # a drawn id: no other has it


def reserving_ids(client, keys: Keyspace, ids: Iterable[tuple[str, str]]) -> Reservation:
    """A :class:`Reservation` of these (job id, stored id) pairs, as :func:`reserving`
    takes them (the replay of a dead letter takes them too)."""
    by_shard: dict[ShardKeys, set[str]] = defaultdict(set)  # one script call per shard
    if keys.shards > 1:
        for job_id, stored_id in ids:
            by_shard[keys.shard_for(job_id)].add(keys.reservation(job_id, stored_id))
    return Reservation(client, [sorted(group) for group in by_shard.values()])
