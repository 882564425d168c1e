"""The store on a Redis Cluster whose masters have replicas: a master dies, or hands over to
its replica, and the long-lived clients of the store (a carrier, a producer) follow.

Real processes: three masters, one replica each; the broker is the session's Redis. Redis
replicates asynchronously, so the jobs of the test are written, and copied to the replicas,
before the master dies: what is tested is that everything the replicas hold is published
and that the clients find the new masters, not Redis's replication.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from celery_delayq import DelayQ, StoreUnavailable, scripts
from celery_delayq.carrier import Carrier
from celery_delayq.testing.redis_server import RedisClusterServer
from tests.conftest import wait_for

QUEUE = "parked.cluster-failover"
TASK = "cluster_failover.noop"


@pytest.fixture
def cluster() -> Iterator[RedisClusterServer]:
    with RedisClusterServer(masters=3, replicas=1) as cluster:
        yield cluster


@pytest.fixture
def broker(redis_server) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(f"{redis_server.url}/8", decode_responses=True)
    client.delete(QUEUE)
    yield client
    client.delete(QUEUE)
    client.close()


def cluster_app(cluster: RedisClusterServer, redis_server) -> DelayQ:
    app = Celery("cluster_failover", broker=f"{redis_server.url}/8", set_as_current=False)
    app.conf.update(delayq_redis_url=cluster.url, delayq_shards=6, delayq_idle_timeout=0.5,
                    delayq_lease_seconds=3, delayq_redis_retries=2,
                    delayq_redis_socket_timeout=1.0, broker_connection_retry_on_startup=True)
    return DelayQ(app)


def schedule(delayq: DelayQ, first: int, count: int, delay: float) -> list[str]:
    """``count`` jobs in one ``schedule_many`` (a script call per shard); their task ids."""
    results = delayq.schedule_many(TASK, [{"args": [n], "delay": delay, "job_id": f"job-{n}"}
                                          for n in range(first, first + count)],
                                   queue=QUEUE)
    return [result.id for result in results]


def published(broker: redis.Redis) -> list[str]:
    """Task ids of the messages the carrier put on the test queue."""
    return [json.loads(m)["headers"]["id"] for m in broker.lrange(QUEUE, 0, -1)]


def replicated(cluster: RedisClusterServer) -> None:
    """Wait until every replica has its master's writes so far."""
    offsets = {}
    for node in cluster.nodes:
        info = redis.Redis(port=node.port).info("replication")
        if info["role"] == "master":
            offsets[node.port] = info["master_repl_offset"]

    def copied(client: redis.Redis) -> bool:
        info = client.info("replication")
        return info["role"] == "master" or info["slave_repl_offset"] >= offsets[
            info["master_port"]]

    for node in cluster.nodes:
        with redis.Redis(port=node.port) as client:
            wait_for(lambda: copied(client),
                     what=f"replica {node.port} to copy its master's writes")


def reservations(cluster: RedisClusterServer, dead: int) -> list[str]:
    """The job-id reservation keys on the live nodes."""
    found = []
    for node in cluster.nodes:
        if node.port != dead:
            with redis.Redis(port=node.port, decode_responses=True) as client:
                found += client.keys("*:reserved:*")
    return found


def time_the_failover(replica: redis.Redis, started: float, took: list[float]) -> None:
    while replica.info("replication")["role"] != "master":
        time.sleep(0.05)
    took.append(time.monotonic() - started)


def master_of(delayq: DelayQ, key: str) -> int:
    return delayq.store.client.get_node_from_key(key).port


@pytest.mark.slow
def test_a_dead_master_is_followed_by_the_carrier_and_a_producer_and_nothing_is_lost(
        cluster, broker, redis_server):
    delayq = cluster_app(cluster, redis_server)
    # the master of the carrier's wake channel, and of some shards' jobs
    victim = master_of(delayq, delayq.store.keys.wake_channel)
    assert victim in {master_of(delayq, shard.due) for shard in delayq.store.keys}
    scheduled = schedule(delayq, 0, 300, delay=0.1)
    scheduled += schedule(delayq, 300, 300, delay=6)  # due after the failover
    replicated(cluster)
    carrier = Carrier(cluster_app(cluster, redis_server).app)  # a client of its own
    thread = threading.Thread(target=carrier.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: set(scheduled[:300]) <= set(published(broker)),
                 what="promotion before the master dies")
        replica = redis.Redis(port=cluster.replica_of(victim).port)
        cluster.node(victim).stop(kill=True)
        started = time.monotonic()
        took: list[float] = []  # when the replica took over, from the kill
        threading.Thread(target=time_the_failover, args=(replica, started, took),
                         daemon=True).start()
        # the same producer, which knew the dead master, schedules again once a replica
        # has taken its slots (refused while the cluster has none for them)
        later = None
        while later is None:
            try:
                later = schedule(delayq, 600, 100, delay=0.1)
            except StoreUnavailable:  # no node serves the dead master's slots yet
                assert time.monotonic() - started < 30, "the producer never recovered"
                # what the failed call reserved on the nodes it reached, it released: its
                # retry does not wait for its own reservations to end by themselves
                assert reservations(cluster, victim) == []
                time.sleep(0.2)
        producer_back = time.monotonic() - started
        scheduled += later
        wait_for(lambda: set(scheduled) <= set(published(broker)), timeout=30,
                 what="every job published after the failover")
        ids = published(broker)
        print(f"\nmaster killed; its replica took over after {took[0]:.1f} s, the producer "
              f"scheduled again after {producer_back:.1f} s; {len(scheduled)} jobs published "
              f"{len(ids)} times ({len(ids) - len(set(ids))} duplicates), the last "
              f"{time.monotonic() - started:.1f} s after the kill")
    finally:
        carrier.stop()
        thread.join(10)
        carrier.store.close()
        delayq.store.close()


def hand_over(replica_port: int, tries: int = 3) -> None:
    """``CLUSTER FAILOVER`` on a replica until it is a master: Redis gives up a manual
    failover that does not end within 5 s (a loaded machine), without saying so."""
    replica = redis.Redis(port=replica_port)
    for _ in range(tries):
        replica.execute_command("CLUSTER", "FAILOVER")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if replica.info("replication")["role"] == "master":
                return
            time.sleep(0.1)
    pytest.fail(f"node {replica_port} did not take over after {tries} manual failovers")


@pytest.mark.parametrize("slot_map", ["read again", "stale"])
def test_a_master_handing_over_to_its_replica_is_followed_at_once(cluster, broker,
                                                                  redis_server, slot_map,
                                                                  monkeypatch):
    """"stale": the slot map read again after a MOVED answer still names the old master (the
    node asked had not heard of the move yet), so calls are led by the answers alone, to a
    new master that has none of the scripts (Redis 7 does not copy them to replicas)."""
    if slot_map == "stale":
        monkeypatch.setattr(scripts, "follow_cluster", lambda client: None)
    delayq = cluster_app(cluster, redis_server)
    store = delayq.store
    schedule(delayq, 0, 60, delay=3600)  # the producer has met every master
    master = master_of(delayq, store.keys.shard(0).due)
    replica = cluster.replica_of(master)
    hand_over(replica.port)
    # the old master holds its clients' calls until it is a replica
    wait_for(lambda: redis.Redis(port=master).info("replication")["role"] == "slave",
             what=f"node {master} to become a replica")
    # every call meets the moved slots first: redis-py follows its own commands there, the
    # store's script calls must too (the old master answers MOVED, and ran nothing)
    assert len(schedule(delayq, 60, 60, delay=3600)) == 60
    claims = store.claim(list(store.keys), 10, 3000)
    assert [c.error for c in claims if c.error] == []
    assert len(store.pending(limit=200)) == 120
    store.close()
