"""schedule_dataframe against a real Redis, with a real carrier and worker for a sample."""

from __future__ import annotations

import logging
import sys
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery
from kombu import Queue

from celery_delayq import DelayedTask, DelayQ, InvalidOption
from celery_delayq.spark import schedule_dataframe
from tests.conftest import wait_for

RECORD = "tests.proj.record"  # record(label): a run a test waits for
TASK = "tests.proj.anything"  # takes any arguments


def _pending(delayq) -> int:
    return sum(row["pending"] for row in delayq.store.stats())


def _journal(delayq) -> int:
    return sum(row["journal"] for row in delayq.store.stats())


def test_hundred_thousand_rows_are_scheduled_and_a_sample_runs_on_a_real_worker(
        spark, app, delayq, proj, worker, carrier):
    from pyspark.sql import functions as F

    sample = 200
    df = (spark.range(100_000, numPartitions=8)
          .withColumn("job", F.concat(F.lit("refund:"), F.col("id").cast("string")))
          .withColumn("delay_s", F.when(F.col("id") < sample, F.lit(0.3))
                      .otherwise(F.lit(3600.0)))
          .withColumn("label", F.concat(F.lit("r"), F.col("id").cast("string"))))

    summary, rejects = schedule_dataframe(df, app, task=RECORD, id_col="job",
                                          delay_col="delay_s", args_cols=["label"])

    assert (summary.scheduled, summary.existed, summary.rejected) == (100_000, 0, 0)
    assert rejects.count() == 0
    wait_for(lambda: len(proj.runs()) >= sample, timeout=30, what=f"{sample} sample runs")
    runs = proj.runs()
    assert sorted(run["label"] for run in runs) == sorted(f"r{n}" for n in range(sample))
    assert {run["job"] for run in runs} == {f"refund:{n}" for n in range(sample)}
    assert _pending(delayq) == 100_000 - sample


def test_repeating_the_same_write_adds_nothing(spark, app, delayq):
    df = spark.createDataFrame([(f"order:{n}", n, 600.0) for n in range(2_000)],
                               "order_id string, n long, delay_s double").repartition(3)
    first, _ = schedule_dataframe(df, app, task=TASK, id_col="order_id",
                                  delay_col="delay_s", args_cols=["n"])
    journal = _journal(delayq)

    again, rejects = schedule_dataframe(df, app, task=TASK, id_col="order_id",
                                        delay_col="delay_s", args_cols=["n"])

    assert (first.scheduled, first.existed) == (2_000, 0)
    assert (again.scheduled, again.existed, again.rejected) == (0, 2_000, 0)
    assert rejects.count() == 0
    assert _pending(delayq) == 2_000
    assert _journal(delayq) == journal


@pytest.fixture
def strict_app(redis_server, redis_client) -> Celery:
    """An app with a fixed queue list (unknown queues are errors) and no tasks at all."""
    strict = Celery("strict", broker=f"{redis_server.url}/0", set_as_current=False)
    strict.conf.update(task_create_missing_queues=False, task_default_queue="celery",
                       task_queues=[Queue("celery"), Queue("refunds")],
                       delayq_shards=4, delayq_max_payload_bytes=2_000)
    return strict


def test_planted_bad_rows_come_back_exactly_as_rejects_with_reasons(spark, strict_app):
    now = datetime.now(timezone.utc).replace(tzinfo=None)  # session time zone is UTC
    soon, never = now + timedelta(hours=1), datetime(2999, 1, 1)
    good = [(f"ok:{n}", soon, "x", "refunds") for n in range(50)]
    bad = [
        (None, soon, "x", "refunds"),
        ("bad-eta:null", None, "x", "refunds"),
        ("bad-eta:far", never, "x", "refunds"),
        ("too-big", soon, "x" * 5_000, "refunds"),
        ("lost", soon, "x", "no-such-queue"),
    ]
    df = spark.createDataFrame(good + bad, "refund_id string, check_at timestamp, "
                               "note string, q string").repartition(2)

    summary, rejects = schedule_dataframe(df, strict_app, task="shop.tasks.check_refund",
                                          id_col="refund_id", eta_col="check_at",
                                          args_cols=["refund_id", "note"], queue_col="q")

    assert (summary.scheduled, summary.existed, summary.rejected) == (50, 0, 5)
    assert rejects.columns == ["refund_id", "check_at", "note", "q", "reason"]
    reasons = {row.refund_id: row.reason for row in rejects.collect()}
    assert set(reasons) == {None, "bad-eta:null", "bad-eta:far", "too-big", "lost"}
    assert reasons[None].startswith("null id")
    assert reasons["bad-eta:null"].startswith("bad eta")
    assert "delayq_max_delay" in reasons["bad-eta:far"]
    assert "delayq_max_payload_bytes=2000" in reasons["too-big"]
    assert reasons["lost"].startswith("unknown queue") and "no-such-queue" in reasons["lost"]
    kept = rejects.where("refund_id = 'too-big'").first()
    assert (kept.note, kept.q) == ("x" * 5_000, "refunds")


def test_a_row_whose_queue_list_would_be_a_store_key_is_a_reject(spark, redis_server,
                                                                 redis_client):
    """kombu's ``global_keyprefix`` travels to the executors: under it the queue
    ``delayq:{0}:due`` is kept in the list ``app:delayq:{0}:due``, a key of this store."""
    prefixed = Celery("prefixed", broker=f"{redis_server.url}/0", set_as_current=False)
    prefixed.conf.update(broker_transport_options={"global_keyprefix": "app:"},
                         delayq_prefix="app:delayq", delayq_shards=2)
    rows = [("ok", "delayq:emails"), ("due", "delayq:{0}:due"), ("meta", "delayq:meta")]
    df = spark.createDataFrame([(job, 600.0, q) for job, q in rows],
                               "job string, d double, q string")

    # args_cols: once tests.proj is imported, its shared task record(label) is prefixed's too
    summary, rejects = schedule_dataframe(df, prefixed, task=RECORD, id_col="job",
                                          delay_col="d", args_cols=["job"], queue_col="q")

    assert (summary.scheduled, summary.rejected) == (1, 2)
    reasons = {row.job: row.reason for row in rejects.collect()}
    assert set(reasons) == {"due", "meta"}  # app:delayq:meta is the store's record
    assert all("would keep its messages in a key" in reason for reason in reasons.values())
    assert DelayQ.of(prefixed).get("ok").queue == "delayq:emails"


def test_eta_strings_with_an_offset_and_struct_kwargs_reach_the_stored_job(spark, app, delayq):
    at = (datetime.now(timezone.utc) + timedelta(days=30)).replace(microsecond=0)
    local = at.astimezone(timezone(timedelta(hours=2))).isoformat()
    df = spark.createDataFrame(
        [("r1", local, "order:1", (7, "eur"))],
        "refund_id string, check_at string, order string, kw struct<amount:int,currency:string>")

    summary, _ = schedule_dataframe(df, app, task=TASK, id_col="refund_id",
                                    eta_col="check_at", kwargs_col="kw", key_col="order",
                                    queue="refunds")

    assert summary.scheduled == 1
    job = delayq.get("r1", key="order:1")
    assert local.endswith("+02:00") and job.due == at
    assert job.kwargs == {"amount": 7, "currency": "eur"}
    assert (job.key, job.queue, job.task) == ("order:1", "refunds", TASK)


def test_executors_build_envelopes_without_importing_the_task_code(spark, app, delayq):
    df = spark.range(4, numPartitions=2).selectExpr("cast(id as string) as job", "1.0 as d")
    schedule_dataframe(df, app, task=TASK, id_col="job", delay_col="d")

    probe = spark.sparkContext.parallelize(range(8), 2).mapPartitions(
        lambda _: [m for m in sys.modules if m == "tests" or m.startswith("tests.")])

    assert probe.collect() == []
    assert _pending(delayq) == 4


def test_routes_given_as_code_are_resolved_once_on_the_driver(spark, redis_server,
                                                              redis_client, delayq):
    routed = Celery("routed", broker=f"{redis_server.url}/0", set_as_current=False)
    routed.conf.update(delayq_shards=4,
                       task_routes=[lambda name, *a, **kw: {"queue": f"q-{name.split('.')[-1]}"}])
    df = spark.createDataFrame([("a", 60.0)], "job string, d double")

    schedule_dataframe(df, routed, task="shop.tasks.refund", id_col="job", delay_col="d")

    assert delayq.get("a").queue == "q-refund"


def test_bad_arguments_are_refused_on_the_driver_before_any_write(spark, app, delayq):
    df = spark.createDataFrame([("a", 1.0)], "job string, d double")
    with pytest.raises(InvalidOption, match="exactly one of delay_col"):
        schedule_dataframe(df, app, task=TASK, id_col="job")
    with pytest.raises(InvalidOption, match="'nope' is not a column"):
        schedule_dataframe(df, app, task=TASK, id_col="nope", delay_col="d")
    with pytest.raises(InvalidOption, match="if_exists"):
        schedule_dataframe(df, app, task=TASK, id_col="job", delay_col="d", if_exists="x")
    assert _pending(delayq) == 0


def test_columns_the_task_cannot_take_are_refused_on_the_driver_before_any_write(
        spark, app, delayq):
    df = spark.createDataFrame([("a", 1.0, "x", ("y",), {"label": "z"})],
                               "job string, d double, label string, "
                               "kw struct<lable:string>, named map<string,string>")
    for columns, match in (({"args_cols": ["label", "label"]}, "but 3 were given"),
                           ({"kwargs_col": "kw"}, "unexpected keyword argument 'lable'"),
                           ({}, "missing 1 required positional argument: 'label'")):
        with pytest.raises(InvalidOption, match=f"^{RECORD} cannot be called with these "
                                                f"columns .*{match}"):
            schedule_dataframe(df, app, task=RECORD, id_col="job", delay_col="d", **columns)
    assert _pending(delayq) == 0
    # a map's keys are the row's: not known on the driver; a task not registered there
    schedule_dataframe(df, app, task=RECORD, id_col="job", delay_col="d", kwargs_col="named")
    schedule_dataframe(df, app, task="elsewhere.task", id_col="label", delay_col="d")
    assert _pending(delayq) == 2


def test_options_the_task_declares_apply_unless_a_column_overrides_them(spark, strict_app):
    @strict_app.task(name="shop.tasks.close_order", base=DelayedTask, queue="refunds",
                     priority=7, shared=False)
    def close_order(order_id):  # registered on the driver only
        return order_id

    df = spark.createDataFrame([("a", 600.0, None), ("b", 600.0, "celery")],
                               "order_id string, delay_s double, q string")
    summary, _ = schedule_dataframe(df, strict_app, task=close_order.name, id_col="order_id",
                                    delay_col="delay_s", queue_col="q",
                                    args_cols=["order_id"])

    assert summary.scheduled == 2
    delayq = DelayQ.of(strict_app)
    direct = close_order.apply_delayed(args=("c",), delay=600, job_id="c")  # the same
    stored = {job_id: delayq.get(job_id) for job_id in ("a", "b", direct.job_id)}
    assert {job_id: (job.queue, job.options["p"]["priority"])
            for job_id, job in stored.items()} == {
        "a": ("refunds", 7), "b": ("celery", 7), "c": ("refunds", 7)}


def test_the_callers_job_description_is_left_as_it_was(spark, app, delayq):
    sc = spark.sparkContext
    sc.setJobDescription("nightly refunds")
    df = spark.createDataFrame([("a", 600.0)], "order_id string, delay_s double")
    try:
        schedule_dataframe(df, app, task=TASK, id_col="order_id", delay_col="delay_s")
        assert sc.getLocalProperty("spark.job.description") == "nightly refunds"
        assert sc.getLocalProperty("spark.jobGroup.id") is None
    finally:
        sc.setJobDescription(None)


@pytest.mark.parametrize("past", ["run", "reject"])
def test_etas_that_have_passed_are_counted_and_run_at_once_or_rejected(spark, app, delayq,
                                                                        past):
    now = datetime.now(timezone.utc).replace(tzinfo=None)  # session time zone is UTC
    rows = [("late:1", datetime(1990, 1, 1)), ("late:2", now - timedelta(hours=1)),
            ("soon", now + timedelta(hours=1))]
    df = spark.createDataFrame(rows, "job string, at timestamp")

    summary, rejects = schedule_dataframe(df, app, task=TASK, id_col="job", eta_col="at",
                                          past=past)

    assert summary.past == 2
    if past == "run":
        assert (summary.scheduled, summary.rejected) == (3, 0)
        assert sorted(job.job_id for job in delayq.pending()) == ["late:1", "late:2", "soon"]
    else:
        assert (summary.scheduled, summary.rejected) == (1, 2)
        assert {row.job: row.reason.split(":")[0] for row in rejects.collect()} == {
            "late:1": "eta in the past", "late:2": "eta in the past"}
        assert [job.job_id for job in delayq.pending()] == ["soon"]


def test_epoch_etas_past_any_date_are_rejects_and_fail_no_task(spark, app, delayq):
    """One odd number in an eta column (too large for a date, infinite, NaN) is that row's
    reject: it never fails the Spark task, and so never the whole call."""
    soon = datetime.now(timezone.utc).timestamp() + 3600
    rows = [("soon", soon), ("huge", 1e300), ("year-30000", 9e11), ("big", 1e18),
            ("inf", float("inf")), ("nan", float("nan")), ("ancient", -1e300)]
    df = spark.createDataFrame(rows, "job string, at double")

    summary, rejects = schedule_dataframe(df, app, task=TASK, id_col="job", eta_col="at")

    assert (summary.scheduled, summary.rejected) == (1, 6)
    reasons = {row.job: row.reason for row in rejects.collect()}
    assert sorted(reasons) == ["ancient", "big", "huge", "inf", "nan", "year-30000"]
    assert all(reason.startswith("bad eta") and "year 1 to 9999" in reason
               for reason in reasons.values()), reasons
    assert [job.job_id for job in delayq.pending()] == ["soon"]


def test_an_unknown_past_policy_is_refused_before_any_write(spark, app, delayq):
    df = spark.createDataFrame([("a", 60.0)], "job string, delay_s double")
    with pytest.raises(InvalidOption, match="past='later'"):
        schedule_dataframe(df, app, task=TASK, id_col="job", delay_col="delay_s",
                           past="later")
    assert delayq.pending() == []


def test_duplicate_ids_have_one_winner_by_content_whatever_the_partitioning(spark, app,
                                                                            delayq):
    """Each duplicated id is written once, from the same row in every partitioning and
    order; the other rows come back as rejects and never reach Redis."""
    rows = [(f"order:{n % 40}", n, 600.0) for n in range(120)]  # every id three times
    rows += [(f"single:{n}", n, 600.0) for n in range(10)]
    schema = "order_id string, n long, delay_s double"
    winners = []
    for order, partitions in ((rows, 1), (rows[::-1], 3), (rows[40:] + rows[:40], 7)):
        delayq.store.client.flushall()
        df = spark.createDataFrame(order, schema).repartition(partitions)
        summary, rejects = schedule_dataframe(df, app, task=TASK, id_col="order_id",
                                              delay_col="delay_s", args_cols=["n"])

        assert (summary.scheduled, summary.existed, summary.rejected) == (50, 0, 80)
        assert {row.reason for row in rejects.collect()} == {
            f"duplicate id in input: another row of it has job id {f'order:{n}'!r}"
            for n in range(40)}
        assert _journal(delayq) == 50  # the losers never reached Redis
        winners.append({job.job_id: job.args for job in delayq.pending(limit=100)})
        won = [args[0] for job_id, args in winners[-1].items() if job_id.startswith("order")]
        assert sorted(won + [row.n for row in rejects.collect()]) == list(range(120))
    assert winners[0] == winners[1] == winners[2]
    # the row whose used columns sort first as JSON text: '"n":47}' before '"n":7}'
    assert winners[0]["order:7"] == [47]


def test_duplicate_ids_differing_below_a_millisecond_have_one_winner_in_any_order(
        spark, app, delayq):
    early, late = (datetime(2030, 1, 1, microsecond=n, tzinfo=timezone.utc) for n in (1, 2))
    outcomes = []
    for rows in ([("a", 60.0, early), ("a", 60.0, late)],
                 [("a", 60.0, late), ("a", 60.0, early)]):
        delayq.store.client.flushall()
        df = spark.createDataFrame(rows, "job string, d double, ts timestamp").coalesce(1)
        summary, rejects = schedule_dataframe(df, app, task=TASK, id_col="job",
                                              delay_col="d", args_cols=["ts"])

        assert (summary.scheduled, summary.rejected) == (1, 1)
        outcomes.append((delayq.get("a").args,
                         [row.ts.microsecond for row in rejects.collect()]))
    # in both orders the row whose text sorts first (.000001) won, the other is the reject
    assert outcomes == [(["2030-01-01T00:00:00.000001+00:00"], [2])] * 2


def test_columns_no_call_uses_are_never_computed_or_sent_to_python(spark, app, delayq,
                                                                  redis_server):
    from pyspark.sql import functions as F

    url = f"{redis_server.url}/0"

    @F.udf("string")
    def unused(n):  # no hints: pyspark would read them as a pandas UDF's
        import redis

        redis.Redis.from_url(url).incr("test:unused")
        return "x" * 300_000

    df = (spark.range(2_000, numPartitions=2)
          .selectExpr("concat('u:', cast(id as string)) as job", "600.0 as d", "id")
          .withColumn("blob", unused("id")))
    summary, rejects = schedule_dataframe(df, app, task=TASK, id_col="job", delay_col="d",
                                          args_cols=["id"])

    assert (summary.scheduled, rejects.count()) == (2_000, 0)
    assert delayq.store.client.get("test:unused") is None


def test_used_columns_named_with_dots_or_backticks_are_scheduled_and_rejected(spark, app,
                                                                             delayq):
    """Spark reads a dot in a column name as a field of a struct and a backtick as a
    quote; the used columns go by their names as they are."""
    from pyspark.sql import types as T

    schema = T.StructType([T.StructField("order.id", T.StringType()),
                           T.StructField("delay.s", T.DoubleType()),
                           T.StructField("n`th", T.LongType()),
                           T.StructField("note.`x`", T.StringType())])
    df = spark.createDataFrame([("a", 600.0, 1, "won"), ("a", 600.0, 2, "lost"),
                                ("b", None, 3, "no delay")], schema)

    summary, rejects = schedule_dataframe(df, app, task=TASK, id_col="order.id",
                                          delay_col="delay.s", args_cols=["n`th"],
                                          key_col="order.id")

    assert (summary.scheduled, summary.existed, summary.rejected) == (1, 0, 2)
    assert rejects.columns == [*df.columns, "reason"]
    assert sorted(tuple(row) for row in rejects.collect()) == [
        ("a", 600.0, 2, "lost", "duplicate id in input: another row of it has job id 'a'"),
        ("b", None, 3, "no delay", "null delay: delay.s is empty")]
    assert delayq.get("a", key="a").args == [1]


@pytest.mark.parametrize("interval", ["make_interval(1, 2, 0, 3)",
                                      "interval '1-2' year to month"])
def test_rejects_with_an_interval_python_cannot_read_stay_in_spark_after_the_write(
        spark, app, delayq, caplog, interval):
    df = spark.sql(f"select 'ok' as job, 60.0 as d, {interval} as extra "
                   f"union all select null, 60.0, {interval}")
    with caplog.at_level(logging.WARNING, "celery_delayq.spark.schedule"):
        summary, rejects = schedule_dataframe(df, app, task=TASK, id_col="job",
                                              delay_col="d")

    assert (summary.scheduled, summary.rejected) == (1, 1)
    assert [tuple(row) for row in rejects.select("job", "extra", "reason")
            .selectExpr("job", "cast(extra as string)", "reason").collect()] == [
        (None, spark.sql(f"select cast({interval} as string)").first()[0],
         "null id: job is empty")]
    assert "stay in Spark" in caplog.text
