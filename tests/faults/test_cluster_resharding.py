"""The store on a Redis Cluster while a shard's slot moves to another master, key by key,
as ``redis-cli --cluster reshard`` moves it: calls meet ``TRYAGAIN`` while the slot's keys
are split between the two nodes, then ``ASK`` until the move is announced.

The move is done by hand, step by step (``CLUSTER SETSLOT ... IMPORTING / MIGRATING``,
``MIGRATE``, ``CLUSTER SETSLOT ... NODE``), so each window is tested as long as needed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from celery_delayq import DelayQ, StoreUnavailable
from celery_delayq.testing.redis_server import RedisClusterServer
from tests.faults.test_cluster_failover import TASK

KEY = "order:1"  # its shard's slot is the one that moves


@pytest.fixture
def moving(redis_server) -> Iterator[tuple[DelayQ, redis.Redis, redis.Redis, int]]:
    """A store with 20 jobs of KEY on 3 masters, and its shard's slot marked as moving to
    another master: (store, the slot's node, the node it moves to, the slot)."""
    with RedisClusterServer(masters=3) as cluster:
        app = Celery("resharding", broker=f"{redis_server.url}/8", set_as_current=False)
        app.conf.update(delayq_redis_url=cluster.url, delayq_shards=6, delayq_redis_retries=1)
        delayq = DelayQ(app)
        delayq.schedule_many(TASK, [{"args": [n], "delay": 600, "key": KEY}
                                    for n in range(20)])
        client = delayq.store.client
        due = delayq.store.keys.shard_for("", KEY).due
        slot, source = client.keyslot(due), client.get_node_from_key(due)
        target = next(node for node in client.get_nodes() if node.name != source.name)
        old, new = redis.Redis(port=source.port), redis.Redis(port=target.port)
        new.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", old.cluster("myid"))
        old.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", new.cluster("myid"))
        yield delayq, old, new, slot
        delayq.store.close()


def announce(delayq: DelayQ, new: redis.Redis, slot: int) -> None:
    """End the move: every master says the slot is ``new``'s."""
    for node in delayq.store.client.get_nodes():
        with redis.Redis(port=node.port) as client:
            client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", new.cluster("myid"))


def migrate(old: redis.Redis, new: redis.Redis, slot: int, count: int) -> None:
    """Move ``count`` of the slot's keys (all: 0) from ``old`` to ``new``."""
    keys = old.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
    port = new.connection_pool.connection_kwargs["port"]
    old.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS",
                        *(keys[:count] if count else keys))


def test_a_shard_whose_keys_are_split_between_two_nodes_refuses_calls_as_unavailable(moving):
    delayq, old, new, slot = moving
    migrate(old, new, slot, 2)
    with pytest.raises(StoreUnavailable, match="moving"):
        delayq.schedule(TASK, [1], delay=600, key=KEY, job_id="refused")
    claims = delayq.store.claim(list(delayq.store.keys), 10, 3000)
    assert ["moving" in str(claim.error) for claim in claims].count(True) == 1
    migrate(old, new, slot, 0)
    assert delayq.get("refused", key=KEY) is None  # the refused call wrote nothing


def test_calls_asked_to_the_node_a_slot_moves_to_follow_the_answer(moving):
    """Every key moved, the move not yet announced: the old node answers ASK. A call whose
    keys all exist there runs after ASKING; one that would create a key meets TRYAGAIN
    (Redis cannot tell a key not made yet from one still to come), as the claim of a shard
    that has no in-flight set does, and a schedule of a job due within a resend of the
    call (it keeps its reply in a key of its own), until the move is announced."""
    delayq, old, new, slot = moving
    migrate(old, new, slot, 0)
    results = delayq.schedule_many(TASK, [{"args": [n], "delay": 600, "key": f"k{n}"}
                                          for n in range(30)] +
                                   [{"args": [n], "delay": 600, "key": KEY} for n in range(5)])
    assert len(results) == 35
    with pytest.raises(StoreUnavailable, match="moving"):  # it would keep its reply in a
        delayq.schedule(TASK, [1], delay=0, key=KEY)  # key of its own (lost replies)
    claims = delayq.store.claim(list(delayq.store.keys), 100, 3000)
    refused = [claim for claim in claims if claim.error is not None]
    assert all("moving" in str(claim.error) for claim in refused) and len(refused) <= 1
    announce(delayq, new, slot)
    claims = delayq.store.claim(list(delayq.store.keys), 100, 3000)
    assert [claim.error for claim in claims] == [None] * 6
    assert len(delayq.pending(limit=100)) == 55
    assert delayq.cancel_key(KEY) == 25


def test_a_batch_refused_on_a_moving_shard_says_which_of_its_jobs_were_stored(moving):
    """The calls of its other shards ran: told that nothing was written, a producer sent
    the whole batch again, and 251 of 300 jobs were stored (and run) twice."""
    delayq, old, new, slot = moving
    before = {job.job_id for job in delayq.pending(limit=100)}
    migrate(old, new, slot, 2)
    items = [{"args": [n], "delay": 600, "key": f"k{n}"} for n in range(30)] + \
        [{"args": [n], "delay": 600, "key": KEY} for n in range(5)]
    with pytest.raises(StoreUnavailable, match=r"moving.* of this call stored \(their ids") \
            as refused:
        delayq.schedule_many(TASK, items)
    migrate(old, new, slot, 0)
    announce(delayq, new, slot)
    stored = {job.job_id for job in delayq.pending(limit=100)} - before
    moving_shard = delayq.store.keys.shard_for("", KEY)
    assert set(refused.value.stored) == stored
    assert len(stored) == sum(delayq.store.keys.shard_for("", item["key"]) is not moving_shard
                              for item in items) > 0
