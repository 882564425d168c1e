"""Mistakes of the call itself are refused on the driver, before any Spark job; a bad value
in one row is that row's reject, never a failed job."""

from __future__ import annotations

import pytest
from celery import Celery
from kombu import Queue

from celery_delayq import InvalidOption, PayloadError, UnknownQueue
from celery_delayq.spark import schedule_dataframe

TASK = "tests.proj.anything"


def _pending(delayq) -> int:
    return sum(row["pending"] for row in delayq.store.stats())


@pytest.fixture
def no_job(monkeypatch) -> None:
    """Fail the test if the call gets as far as its first Spark job (the duplicate ids'
    count): a refusal on the driver comes before it."""
    from celery_delayq.spark import schedule

    def first_job(*args):
        raise AssertionError("schedule_dataframe started a Spark job")

    monkeypatch.setattr(schedule, "_source", first_job)


def _app(redis_server, **conf) -> Celery:
    app = Celery("refusals", broker=f"{redis_server.url}/0", set_as_current=False)
    app.conf.update(delayq_shards=4, **conf)
    return app


@pytest.mark.parametrize("task", ["shop.\x1brefund", "shop.\u202erefund"])
def test_a_task_name_with_a_forbidden_character_is_refused_before_any_spark_job(
        no_job, spark, app, delayq, task):
    df = spark.createDataFrame([("a", 60.0)], "job string, d double")
    with pytest.raises(InvalidOption, match=r"task name .* holds U\+"):
        schedule_dataframe(df, app, task=task, id_col="job", delay_col="d")
    assert _pending(delayq) == 0


def test_a_queue_the_app_cannot_route_to_is_refused_before_any_spark_job(
        no_job, spark, redis_server, redis_client):
    strict = _app(redis_server, task_create_missing_queues=False,
                  task_default_queue="celery", task_queues=[Queue("celery")])
    df = spark.createDataFrame([("a", 60.0)], "job string, d double")
    with pytest.raises(UnknownQueue, match=r"unknown queue.*'nope'"):
        schedule_dataframe(df, strict, task=TASK, id_col="job", delay_col="d", queue="nope")


def test_a_pickle_serializer_is_refused_before_any_spark_job(no_job, spark, redis_server,
                                                              redis_client):
    pickled = _app(redis_server, task_serializer="pickle")
    df = spark.createDataFrame([("a", 60.0)], "job string, d double")
    with pytest.raises(PayloadError, match="JSON only"):
        schedule_dataframe(df, pickled, task=TASK, id_col="job", delay_col="d")


@pytest.mark.parametrize("kind", ["string", "boolean", "timestamp", "array<double>"])
def test_a_delay_column_that_is_not_numeric_is_refused_before_any_spark_job(
        no_job, spark, app, delayq, kind):
    df = spark.sql(f"select 'a' as job, cast(null as {kind}) as d")
    with pytest.raises(InvalidOption, match="delay_col 'd' is "):
        schedule_dataframe(df, app, task=TASK, id_col="job", delay_col="d")


@pytest.mark.parametrize("kind", ["binary", "struct<b:binary>", "array<binary>",
                                  "map<string,binary>", "array<struct<m:map<int,binary>>>"])
def test_a_binary_argument_column_is_refused_before_any_spark_job(no_job, spark, app,
                                                                   delayq, kind):
    df = spark.sql(f"select 'a' as job, 60.0d as d, cast(null as {kind}) as b")
    for columns in ({"args_cols": ["b"]}, {"kwargs_col": "kw"}):
        data = df.selectExpr("*", "named_struct('b', b) as kw")
        with pytest.raises(InvalidOption, match="binary"):
            schedule_dataframe(data, app, task=TASK, id_col="job", delay_col="d", **columns)


def test_a_value_python_cannot_read_is_that_rows_reject_not_a_failed_job(spark, app,
                                                                          delayq):
    """A date past year 9999 (Spark holds one, Python's date cannot) rejects its row
    alone; the rows before and after it in the partition are scheduled."""
    from pyspark.sql import functions as F

    day = F.when(F.col("id") == 350, F.expr("date_add(date'9999-12-31', 5)")).otherwise(
        F.expr("date'2030-01-31'"))
    df = spark.range(0, 400, numPartitions=2).select(
        F.concat(F.lit("row:"), F.col("id").cast("string")).alias("job"),
        F.lit(600.0).alias("d"), day.alias("day"), F.struct(day.alias("on")).alias("when"))
    for column in ("day", "when"):
        delayq.store.client.flushall()
        summary, rejects = schedule_dataframe(df, app, task=TASK, id_col="job",
                                              delay_col="d", args_cols=[column],
                                              batch_size=50)
        assert (summary.scheduled, summary.rejected) == (399, 1)
        (reject,) = rejects.select("job", "reason").collect()  # the day: not in Python
        assert reject.job == "row:350"
        assert reject.reason.startswith(f"{column} holds a value Python cannot read")
        assert _pending(delayq) == 399
