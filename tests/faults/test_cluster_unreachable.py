"""The store on a Redis Cluster that is not up yet, has no node answering, or is no cluster
at all: a carrier waits for it as it waits for one Redis, and producers get errors of ours
that say what to do (redis-py's cluster client raises ``RedisClusterException``, which is
not even a ``RedisError``)."""

from __future__ import annotations

import threading

import pytest
from celery import Celery

from celery_delayq import ConfigurationError, DelayQ, StoreUnavailable
from celery_delayq.carrier import Carrier
from celery_delayq.testing.redis_server import RedisClusterServer, free_port
from tests.conftest import wait_for
from tests.faults.test_cluster_failover import QUEUE, TASK, broker, published  # noqa: F401

PASSWORD = "cluster-secret"


def app_for(url: str, redis_server) -> Celery:
    app = Celery("cluster_unreachable", broker=f"{redis_server.url}/8", set_as_current=False)
    app.conf.update(delayq_redis_url=url, delayq_idle_timeout=0.5, delayq_redis_retries=1,
                    delayq_redis_socket_timeout=1.0)
    return app


def test_a_carrier_started_before_its_cluster_waits_for_it_then_promotes(
        redis_server, broker):  # noqa: F811
    cluster = RedisClusterServer(masters=3)  # its ports are chosen; nothing listens yet
    carrier = Carrier(app_for(cluster.url, redis_server))
    failures: list[BaseException] = []

    def run() -> None:
        try:
            carrier.run()
        except BaseException as exc:  # what used to end the carrier
            failures.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        thread.join(1.5)  # a few rounds refused
        assert failures == [] and thread.is_alive()
        with cluster:
            delayq = DelayQ(app_for(cluster.url, redis_server))
            sent = [r.id for r in delayq.schedule_many(TASK, [{"args": [n], "delay": 0.1}
                                                              for n in range(20)],
                                                       queue=QUEUE)]
            wait_for(lambda: sorted(published(broker)) == sorted(sent), timeout=30,
                     what="the carrier to promote once the cluster is up")
            delayq.store.close()
    finally:
        carrier.stop()
        thread.join(10)
    assert failures == []


def test_a_producer_gets_store_unavailable_while_no_node_answers(redis_server):
    url = f"redis+cluster://:{PASSWORD}@127.0.0.1:{free_port()}"
    delayq = DelayQ(app_for(url, redis_server))
    with pytest.raises(StoreUnavailable, match="check that its nodes run") as refused:
        delayq.schedule(TASK, [1], delay=60)
    assert PASSWORD not in str(refused.value)


def test_a_cluster_url_naming_one_redis_server_says_to_drop_the_cluster_scheme(redis_server):
    url = redis_server.url.replace("redis://", "redis+cluster://")
    delayq = DelayQ(app_for(url, redis_server))
    with pytest.raises(ConfigurationError, match=r"not a cluster node.*redis://"):
        delayq.schedule(TASK, [1], delay=60)
