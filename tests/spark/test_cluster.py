"""schedule_dataframe against a real 3-master Redis Cluster: shards spread, writes idempotent."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

from celery_delayq import DelayQ
from celery_delayq.spark import schedule_dataframe
from celery_delayq.testing.redis_server import RedisClusterServer


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterServer]:
    with RedisClusterServer() as server:
        yield server


def test_rows_spread_over_the_cluster_masters_and_a_repeat_adds_nothing(spark, cluster,
                                                                       redis_server):
    app = Celery("on-cluster", broker=f"{redis_server.url}/0", set_as_current=False)
    app.conf.update(delayq_redis_url=cluster.url, delayq_shards=6)
    df = spark.range(3_000, numPartitions=3).selectExpr(
        "concat('c:', cast(id as string)) as job", "600.0 as d", "id")

    first, _ = schedule_dataframe(df, app, task="shop.refund", id_col="job", delay_col="d",
                                  args_cols=["id"])
    again, _ = schedule_dataframe(df, app, task="shop.refund", id_col="job", delay_col="d",
                                  args_cols=["id"])

    assert (first.scheduled, again.scheduled, again.existed) == (3_000, 0, 3_000)
    store = DelayQ(app).store
    assert sum(row["pending"] for row in store.stats()) == 3_000
    masters = {store.client.keyslot(shard.due) for shard in store.keys}
    nodes = {store.client.get_node_from_key(shard.due).name for shard in store.keys}
    assert len(masters) == 6 and len(nodes) > 1
    assert store.get("c:42").args == [42]
    store.close()
