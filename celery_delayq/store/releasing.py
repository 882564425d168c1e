"""Pauses and rate limits in the store: marking them on every shard, and the release that
gives back the jobs they held once a pause is resumed or a limit removed.

A release walks each shard's held jobs, :data:`RELEASE_CHUNK` per script call, so a shard
holding a million jobs never blocks Redis for long. The walk's place is kept on its shard
(the ``releasing`` hash, ``scripts/include/releasing.lua``) under the token of the resume
or removal that began it: when that caller stops part way (Ctrl-C, a lost connection, a
web request killed by its server's timeout), a carrier serving the shard goes on with it
once it has not moved for :data:`RELEASE_STALE_MS`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

from ..errors import DelayQError
from ..keys import ShardKeys
from ..ratelimit import OFF
from ..scripts import SCRIPTS, Script, execute
from .base import StoreBase, shard_error

#: Held jobs one release script call looks at: ~7 ms of Redis.
RELEASE_CHUNK = 1000
#: How long a release may stand still (by Redis's clock) before a carrier goes on with it.
RELEASE_STALE_MS = 5000
#: The releases there are: after a resume (entry "paused"), after a limit's removal
#: ("rate:<queue>"); as (kind, names a queue).
_KINDS = {("paused", False), ("rate", True)}


Progress = Callable[[int], object]


class Resumed(NamedTuple):
    """What :meth:`Releasing.resumed` did."""

    released: int  # held jobs given back
    was_paused: bool  # on some shard; else it only went on with a stopped resume's release


class Walk(NamedTuple):
    """Where one shard's part of a release goes on."""

    shard: ShardKeys
    kind: str  # "paused", or "rate" for the jobs held for ``queue``
    queue: str
    token: str  # of the resume or removal that began it
    where: str  # "<score> <job id>" of the last job looked at and left held; "" first


class Round(NamedTuple):
    """What one round of release calls did."""

    released: int  # jobs given back
    going_on: list[Walk]  # the walks with more to look at, from where they stopped
    failed: dict[ShardKeys, DelayQError]  # the shards whose call failed, with why


class Releasing(StoreBase):
    """Pause, resume and rate-limit writes, and the releases that follow them."""

    def pause(self, field: str, by: str) -> None:
        """Hold the due jobs of a task or queue (a ``pausing.field``) on every shard."""
        self._on_every_shard(SCRIPTS["pause"], ["pause", field, by, ""])

    def resumed(self, field: str, by: str, progress: Progress | None = None) -> Resumed:
        """End a pause on every shard, ``progress`` told how many held jobs it gave back
        after each round; says too whether it was paused. Not paused, it still goes on
        with what a resume stopped part way left held."""
        token = _token()
        unmarked = self._on_every_shard(SCRIPTS["pause"], ["resume", field, by, token])
        released = self._release_all("paused", "", token, progress)
        return Resumed(released, any(int(reply) == 1 for reply in unmarked))

    def set_rate_limit(self, queue: str, limit: str, by: str) -> int:
        """Set a queue's rate limit on every shard (``ratelimit.bucket``), or remove it with
        ``ratelimit.OFF``; returns how many held jobs a removal gave back."""
        token = _token()
        self._on_every_shard(SCRIPTS["limit"], [queue, limit, by, token])
        return self._release_all("rate", queue, token) if limit == OFF else 0

    def _on_every_shard(self, script: Script, args: list[Any]) -> list[Any]:
        """Run a pause / limit script on every shard (it journals on shard 0 only);
        returns each shard's reply."""
        calls = [(script, script.keys_for(s), [self._maxlen if s.shard == 0 else 0, *args])
                 for s in self.keys]
        with self.unavailable():
            return execute(self.client, calls)

    def _release_all(self, kind: str, queue: str, token: str,
                     progress: Progress | None = None) -> int:
        """Give back, on every shard, the jobs held ``kind`` that nothing holds any more,
        round after round until every shard is done. A shard whose call fails (a damaged
        key) stops, the others go on, then its error is raised."""
        done = self.release_held([Walk(shard, kind, queue, token, "") for shard in self.keys],
                                 progress=progress)
        if done.failed:
            raise next(iter(done.failed.values()))
        return done.released

    def release_held(self, walks: list[Walk], rounds: int | None = None,
                     progress: Progress | None = None) -> Round:
        """Go on with ``walks`` for up to ``rounds`` rounds (None: until they end),
        ``progress`` told how many jobs were given back after each round."""
        released, failed = 0, {}
        while walks and rounds != 0:
            done = self._release_round(walks)
            released += done.released
            failed.update(done.failed)
            walks = done.going_on
            rounds = None if rounds is None else rounds - 1
            if progress is not None:
                progress(released)
        return Round(released, walks, failed)

    def _release_round(self, walks: list[Walk]) -> Round:
        """One release script call per walk, in one round trip."""
        script = SCRIPTS["release"]
        calls = [(script, script.keys_for(walk.shard),
                  [walk.kind, walk.queue, walk.where, RELEASE_CHUNK, self.config.default_queue,
                   self.keys.wake_channel, walk.shard.shard, walk.token]) for walk in walks]
        with self.unavailable():
            replies = execute(self.client, calls, raise_errors=False)
        done = [(walk, reply) for walk, reply in zip(walks, replies, strict=True)
                if not isinstance(reply, Exception)]
        return Round(sum(reply[0] for _, reply in done),
                     [walk._replace(where=reply[2]) for walk, reply in done if reply[1]],
                     {walk.shard: shard_error(reply)
                      for walk, reply in zip(walks, replies, strict=True)
                      if isinstance(reply, Exception)})

    def stalled_releases(self, shards: list[ShardKeys], going_on: set[str]) -> list[Walk]:
        """The releases on ``shards`` whose caller stopped: not moved on for
        :data:`RELEASE_STALE_MS` by Redis's clock, or of a token in ``going_on`` (the
        carrier's own from its last round). A shard whose ``releasing`` key is damaged is
        passed over (its claims report it), as is an entry of no known kind."""
        if not shards:
            return []
        with self.unavailable():
            pipe = self.client.pipeline(transaction=False)
            for shard in shards:
                pipe.hgetall(shard.releasing)
            entries = pipe.execute(raise_on_error=False)
        found = [(shard, under_way) for shard, under_way in zip(shards, entries, strict=True)
                 if under_way and not isinstance(under_way, Exception)]
        if not found:  # the carrier asks every maintenance: Redis's clock only when needed
            return []
        with self.unavailable():
            now_ms = self.now_ms()
        walks = []
        for shard, under_way in found:
            for entry, value in under_way.items():
                kind, _, queue = entry.partition(":")
                token, _, rest = value.partition(" ")
                moved_ms, _, where = rest.partition(" ")
                stalled = not moved_ms.isdigit() or now_ms - int(moved_ms) >= RELEASE_STALE_MS
                if (kind, bool(queue)) in _KINDS and (token in going_on or stalled):
                    walks.append(Walk(shard, kind, queue, token, where))
        return walks


def _token() -> str:
    """A resume's or removal's own token (its release's, on every shard)."""
    return uuid.uuid4().hex[:16]
