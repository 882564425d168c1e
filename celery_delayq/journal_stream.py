"""The store's journal streams and export positions, as ``delayq export`` reads them.

Reads and writes ``Store`` lacks (``Store.read_journal`` rewrites an unreadable ``job``
field; an export keeps it as text): each shard's stream read as stored, its last entry id,
whether it was trimmed past a position, and the ``<prefix>:export`` hash of positions.
They take the store and run under ``store.unavailable()``; they belong in ``Store``'s
reading part (``store/listing.py``) and sit here only while that package is being split.
"""

from __future__ import annotations

from typing import cast

from .keys import ShardKeys
from .store import Store

#: Stream entries as the store's client reads them: (entry id, fields).
Entries = list[tuple[str, dict[str, str]]]


def positions(store: Store) -> dict[str, str]:
    """Each shard's (as text) last exported entry id."""
    with store.unavailable():
        return cast("dict[str, str]", store.client.hgetall(store.keys.export_position))


def save_position(store: Store, shard: ShardKeys, entry_id: str) -> None:
    """Remember that a shard's stream is exported up to ``entry_id``."""
    with store.unavailable():
        store.client.hset(store.keys.export_position, str(shard.shard), entry_id)


def last_entry_id(store: Store, shard: ShardKeys) -> str | None:
    """The id of a shard's newest journal entry; None when the stream is empty."""
    with store.unavailable():
        end = cast("Entries", store.client.xrevrange(shard.journal, "+", "-", count=1))
    return end[0][0] if end else None


def entries(store: Store, shard: ShardKeys, lower: str, upper: str, count: int) -> Entries:
    """Up to ``count`` entries of a shard's stream from ``lower`` to ``upper`` (``XRANGE``
    bounds: ``(`` before an id excludes it), fields as stored."""
    with store.unavailable():
        return cast("Entries", store.client.xrange(shard.journal, lower, upper, count=count))


def trimmed_past(store: Store, shard: ShardKeys, last: str) -> bool:
    """True when entries after ``last`` were trimmed from the stream before export: the
    oldest entry is past ``last``, which is gone too. (Redis 7's ``max-deleted-entry-id``
    cannot tell: XTRIM leaves it at 0-0.)"""
    client = store.client
    with store.unavailable():
        first = client.xinfo_stream(shard.journal).get("first-entry")
        if not first:
            return False
        return _id_tuple(first[0]) > _id_tuple(last) and not client.xrange(
            shard.journal, last, last)


def _id_tuple(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)
