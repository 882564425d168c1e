"""Each row is written at most once per schedule_dataframe call, whatever Spark runs
again: a task retried after a lost attempt, the rejects read after every cached block is
dropped. The summary counts the one write."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from celery_delayq.spark import schedule_dataframe
from tests.store.test_schedule_once import writes

TASK = "tests.proj.anything"  # takes any arguments


def drop_every_cached_block(spark) -> None:
    spark.catalog.clearCache()
    for rdd in spark.sparkContext._jsc.getPersistentRDDs().values():
        rdd.unpersist()


def test_reading_the_rejects_after_every_cached_block_is_dropped_writes_nothing(
        spark, app, delayq, redis_client):
    df = spark.createDataFrame([(f"order:{n}", n) for n in range(1_000)],
                               "order_id string, n long").repartition(3)
    taken = df.where("n < 100")  # stored before: 'error' rejects them
    schedule_dataframe(taken.withColumn("delay_s", taken.n * 0 + 600.0), app, task=TASK,
                       id_col="order_id", delay_col="delay_s")
    with_delay = df.withColumn("delay_s", df.n * 0 + 600.0)

    summary, rejects = schedule_dataframe(with_delay, app, task=TASK, id_col="order_id",
                                          delay_col="delay_s", if_exists="error")
    drop_every_cached_block(spark)
    before = writes(redis_client)

    assert (summary.scheduled, summary.existed, summary.rejected) == (900, 0, 100)
    assert rejects.count() == 100
    assert sorted(row.n for row in rejects.collect()) == list(range(100))
    assert writes(redis_client) == before


@pytest.mark.slow
def test_rows_a_lost_task_attempt_wrote_count_as_scheduled_and_are_not_written_again(
        redis_server, redis_client, delayq):
    run = subprocess.run([sys.executable, "-m", "tests.spark.retried_job",
                          redis_server.url], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])

    assert sorted(int(p) for p in redis_client.lrange("test:lost", 0, -1)) == [0, 1, 2, 3]
    assert max(int(n) for n in redis_client.lrange("test:stored", 0, -1)) > 0  # lost writes
    assert summary == {"scheduled": 16_000, "existed": 0, "rejected": 0, "rejects": 0}
    events = [event for shard in delayq.store.keys
              for _, event in delayq.store.client.xrange(shard.journal)]
    assert len([e for e in events if e["event"] == "scheduled"]) == 16_000
    assert len(delayq.pending(limit=50_000)) == 16_000


def test_a_run_whose_outcome_cannot_be_dropped_still_returns_and_says_so(delayq, caplog):
    """Dropping the outcome is clean-up after a finished write: when Redis refuses it (gone,
    or an ACL without UNLINK), the call's summary stands and the outcome expires by itself."""
    from dataclasses import replace

    from celery_delayq.spark.schedule import forget_run
    from celery_delayq.testing.redis_server import free_port

    gone = replace(delayq.config, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    forget_run(gone, "run-1")
    assert "could not drop the outcome of run run-1" in caplog.text
    assert "expires by itself" in caplog.text
