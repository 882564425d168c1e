"""Each row is written at most once per schedule_dataframe call, whatever Spark runs
again: a task retried after a lost attempt, the rejects read after every cached block is
dropped; and once per named run given again. The summary counts the one write, also once
its eta has passed."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from celery_delayq.spark import Summary, schedule_dataframe
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


def spread_etas(start: float, step: float):
    """Etas (epoch seconds) by row id, from a second after ``start``, ``step`` apart: a
    write, however late it starts, finds rows due after it (it writes them) as long as
    the last is not past."""
    from pyspark.sql import functions as F

    return (F.lit(start + 1) + F.col("id") * step).alias("at")


def wait_past(eta: float) -> None:
    time.sleep(max(0.0, eta + 0.2 - time.time()))


def first_due(client) -> float:
    """The earliest due time of the stored jobs, epoch seconds (0 when none)."""
    return min((score / 1000 for key in client.scan_iter("delayq:*:due")
                for _, score in client.zrange(key, 0, 0, withscores=True)), default=0.0)


def stored_when_settled(client) -> int:
    """How many jobs are stored once there are some and none came for a second (or a
    minute has passed: a Python worker may take seconds to start)."""
    counts, deadline = [0], time.time() + 60
    while (counts[-1] == 0 or len(set(counts[-5:])) > 1) and time.time() < deadline:
        time.sleep(0.2)
        counts.append(sum(client.zcard(key) for key in client.scan_iter("delayq:*:due")))
    return counts[-1]


def test_a_named_run_replayed_after_its_etas_passed_counts_its_rows_as_it_did_first(
        spark, app, delayq, redis_client):
    """With past="reject", a replayed run (a micro-batch Spark runs again after a restart)
    rejects as past only rows it never wrote: those it wrote count as scheduled."""
    from pyspark.sql import functions as F

    start = time.time()
    df = spark.range(100, numPartitions=2).select(
        F.concat(F.lit("order:"), F.col("id").cast("string")).alias("job"),
        spread_etas(start, 1.5), F.col("id").alias("n"))
    keywords = {"task": TASK, "id_col": "job", "eta_col": "at", "args_cols": ["n"],
                "past": "reject", "run": "stream-demo-7"}
    first, first_rejects = schedule_dataframe(df, app, **keywords)
    before = writes(redis_client)
    wait_past(first_due(redis_client))  # some rows the run wrote are past now

    again, rejects = schedule_dataframe(df, app, **keywords)

    assert first.scheduled > 0
    assert again == first
    assert sorted(rejects.collect()) == sorted(first_rejects.collect())
    assert writes(redis_client) == before
    assert len(delayq.pending(limit=1000)) == first.scheduled


def test_a_named_run_answered_again_with_past_run_counts_what_it_wrote_as_not_past(
        spark, app, delayq, redis_client):
    """With past="run" (the default), rows the run wrote count as they did then when
    it answers them again after their etas passed, not as past."""
    from pyspark.sql import functions as F

    def orders(eta: float):
        return spark.range(20, numPartitions=2).select(
            F.concat(F.lit("order:"), F.col("id").cast("string")).alias("job"),
            F.lit(eta).alias("at"))

    keywords = {"task": TASK, "id_col": "job", "eta_col": "at", "run": "stream-demo-8"}
    first, _ = schedule_dataframe(orders(time.time() + 3600), app, **keywords)
    before = writes(redis_client)

    # The same rows an hour later (the outcome answers by job id): their etas have passed.
    again, _ = schedule_dataframe(orders(time.time() - 60), app, **keywords)

    assert first == Summary(scheduled=20, existed=0, rejected=0, past=0)
    assert again == first
    assert writes(redis_client) == before


def test_a_task_retried_after_its_etas_passed_counts_what_its_lost_attempt_wrote(
        spark, app, delayq, redis_server):
    """With past="reject", the retry of a lost task attempt rejects as past only rows the
    lost attempt never wrote: those it wrote count as scheduled, as they will run."""
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    start, url = time.time(), f"{redis_server.url}/0"

    @F.udf("string")
    def padding_lost_once(n):  # no hints: pyspark would read them as a pandas UDF's
        """1 KB of padding (a UDF's results come back in 64 KB writes: rows before 600
        reach the write); the write's first attempt stops at row 600 until the rows before
        it are written, and the first job written is past due, then dies."""
        context = TaskContext.get()
        if (n == 600 and context.attemptNumber() == 0
                and context.getLocalProperty("spark.jobGroup.id").startswith("delayq-schedule")):
            import redis

            client = redis.Redis.from_url(url)
            client.set("test:stored", stored_when_settled(client))
            wait_past(first_due(client))
            raise RuntimeError("executor lost")
        return "x" * 1_000

    df = spark.range(1_000, numPartitions=1).select(
        F.col("id").alias("n"), F.concat(F.lit("order:"), F.col("id").cast("string"))
        .alias("job"), spread_etas(start, 0.25), padding_lost_once("id").alias("pad"))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        summary, rejects = schedule_dataframe(df, app, task=TASK, id_col="job",
                                              eta_col="at", args_cols=["n", "pad"],
                                              batch_size=50, past="reject")
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    stored = {job.job_id for job in delayq.pending(limit=2_000)}
    assert 0 < int(delayq.store.client.get("test:stored")) <= len(stored)
    assert summary == Summary(scheduled=len(stored), existed=0, rejected=1_000 - len(stored),
                              past=1_000 - len(stored))
    assert not stored & {row.job for row in rejects.collect()}


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


def test_a_call_that_fails_during_its_write_drops_its_outcome(spark, app, delayq,
                                                              redis_client, redis_server):
    """A failed call's rows are not answered again (another call has another name), so
    its outcome is dropped as a finished call's is, not left for 24 h."""
    from pyspark import TaskContext
    from pyspark.errors import PythonException
    from pyspark.sql import functions as F

    url = f"{redis_server.url}/0"

    @F.udf("string")
    def fails_at_600(n):  # 1 KB: rows before 600 reach the write (see above)
        group = TaskContext.get().getLocalProperty("spark.jobGroup.id") or ""
        if n == 600 and group.startswith("delayq-schedule"):
            import redis

            stored_when_settled(redis.Redis.from_url(url))
            raise RuntimeError("the write failed")
        return "x" * 1_000

    df = spark.range(1_000, numPartitions=1).select(
        F.concat(F.lit("order:"), F.col("id").cast("string")).alias("job"),
        F.lit(600.0).alias("d"), fails_at_600("id").alias("pad"))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        with pytest.raises(PythonException, match="the write failed"):
            schedule_dataframe(df, app, task=TASK, id_col="job", delay_col="d",
                               args_cols=["pad"], batch_size=50)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    assert delayq.pending(limit=1)  # rows before the failure were written
    assert list(redis_client.scan_iter("delayq:*:outcome:*")) == []


def test_a_retried_task_that_reads_its_rows_in_another_order_counts_each_once(
        spark, app, delayq, redis_server):
    """A task retried after a lost attempt may read its partition in another order (a
    shuffle computed again). Its rows are the same rows: the ones the lost attempt wrote
    count as scheduled again, none as a duplicate id, and none is written twice."""
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    url = f"{redis_server.url}/0"

    @F.udf("string")
    def job_reordered_on_retry(n):
        """The write's first attempt stops at row 600 once some rows are stored, then
        dies; its retry reads the rows back to front."""
        context = TaskContext.get()
        writing = context.getLocalProperty("spark.jobGroup.id").startswith("delayq-schedule")
        if writing and context.attemptNumber() == 0 and n == 600:
            import redis

            client = redis.Redis.from_url(url)
            client.set("test:stored", stored_when_settled(client))
            raise RuntimeError("executor lost")
        return f"order:{999 - n if writing and context.attemptNumber() else n}"

    @F.udf("string")
    def padding(n):  # 1 KB: a UDF's results come back in 64 KB writes (rows reach the write)
        return "x" * 1_000

    df = spark.range(1_000, numPartitions=1).select(
        F.col("id").alias("n"), job_reordered_on_retry("id").alias("job"),
        F.lit(3_600.0).alias("d"), padding("id").alias("pad"))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        summary, rejects = schedule_dataframe(df, app, task=TASK, id_col="job",
                                              delay_col="d", args_cols=["pad"], batch_size=50)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    assert int(delayq.store.client.get("test:stored")) > 0  # the lost attempt wrote some
    assert summary == Summary(scheduled=1_000, existed=0, rejected=0, past=0)
    assert rejects.count() == 0
    assert len(delayq.pending(limit=2_000)) == 1_000
