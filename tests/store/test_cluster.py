"""The store on a real 3-master Redis Cluster (``DELAYQ_TEST_STORE=cluster``, run by make test)."""

from __future__ import annotations

import pytest

from tests.conftest import CLUSTER

pytestmark = pytest.mark.skipif(
    not CLUSTER, reason="needs the cluster pass: DELAYQ_TEST_STORE=cluster pytest tests/store")


def test_shards_spread_over_every_master(proj, delayq):
    for i in range(200):
        proj.record.apply_delayed(args=(i,), delay=60, key=f"order:{i}")
    client = delayq.store.client
    holders = {client.get_node_from_key(shard.due).name
               for shard in delayq.store.keys if client.zcard(shard.due)}
    assert len(holders) == len(client.get_primaries()) == 3


def test_client_is_a_cluster_client(delayq):
    from redis.cluster import RedisCluster

    assert isinstance(delayq.store.client, RedisCluster)
