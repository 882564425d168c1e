"""``Streams.journal_lost_after``: what the journal's readers (export, the Django mirror)
are told of entries gone after their saved position."""

from __future__ import annotations


def test_a_journal_made_again_below_the_position_is_reported_lost_up_to_it(delayq,
                                                                            redis_client):
    """Redis lost its data and the new server's clock is behind: every id of the new
    journal is below the reader's position, which used to read as nothing lost."""
    store = delayq.store
    shard = store.keys.shard(0)
    for ms in (1000, 1001, 1002):
        store.client.xadd(shard.journal, {"event": "scheduled", "job": f"j{ms}"},
                          id=f"{ms}-0")

    assert store.journal_lost_after(shard, "5000-7") == "5000-7"
    store.client.xtrim(shard.journal, maxlen=0, approximate=False)  # empty, made below
    assert store.journal_lost_after(shard, "5000-7") == "5000-7"


def test_a_journal_trimmed_or_read_to_its_end_is_reported_as_before(delayq, redis_client):
    store = delayq.store
    shard = store.keys.shard(0)
    for ms in (1000, 1001, 1002):
        store.client.xadd(shard.journal, {"event": "scheduled"}, id=f"{ms}-0")

    assert store.journal_lost_after(shard, "1002-0") is None  # read to its end
    assert store.journal_lost_after(shard, "1000-0") is None
    store.client.xtrim(shard.journal, maxlen=1, approximate=False)
    assert store.journal_lost_after(shard, "1000-0") == "1002-0"  # trimmed past it
    assert store.journal_lost_after(shard, "9-9") == "1002-0"
