"""schedule_stream: schedule_dataframe on each micro-batch of a streaming query, exact
when Spark replays a batch from its checkpoint, caching nothing batch after batch."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from celery_delayq import InvalidOption
from celery_delayq.spark import schedule_stream
from tests.conftest import journal_events
from tests.store.test_schedule_once import writes

TASK = "tests.proj.record"
SCHEMA = "order_id string, n long, delay_s double"
KEYWORDS = {"task": TASK, "id_col": "order_id", "delay_col": "delay_s", "args_cols": ["n"]}


def write_file(folder: Path, name: str, numbers: range, bad: int | None = None) -> None:
    """One JSON-lines file of orders; row ``bad`` has no delay (a reject)."""
    folder.mkdir(exist_ok=True)
    rows = [{"order_id": f"order:{n}", "n": n, "delay_s": None if n == bad else 600.0}
            for n in numbers]
    (folder / name).write_text("".join(json.dumps(row) + "\n" for row in rows))


def run_query(spark, app, folder: Path, checkpoint: Path, on_batch, **options):
    """Run a query over the files there now until it has read them all (or failed)."""
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(folder))
    query = schedule_stream(df, app, checkpoint=str(checkpoint), on_batch=on_batch,
                            trigger={"availableNow": True}, **KEYWORDS, **options)
    try:
        query.awaitTermination(90)
    finally:
        query.stop()


def test_a_micro_batch_replayed_from_its_checkpoint_schedules_nothing_twice(
        spark, app, delayq, redis_client, tmp_path):
    from pyspark.errors import StreamingQueryException

    write_file(tmp_path / "in", "orders-0.json", range(300))
    seen: list[tuple[int, tuple[int, int, int]]] = []

    def crash_before_commit(batch_id, summary, rejects):
        raise RuntimeError("driver lost after the write, before the checkpoint commit")

    with pytest.raises(StreamingQueryException, match="driver lost"):
        run_query(spark, app, tmp_path / "in", tmp_path / "checkpoint", crash_before_commit,
                  if_exists="replace")  # a replay without its outcome would write again
    assert len(delayq.pending(limit=1000)) == 300  # the failed batch did write
    before = writes(redis_client)

    run_query(spark, app, tmp_path / "in", tmp_path / "checkpoint",
              lambda batch_id, summary, rejects: seen.append(
                  (batch_id, (summary.scheduled, summary.existed, summary.rejected))),
              if_exists="replace")

    assert seen == [(0, (300, 0, 0))]  # batch 0 again, counted as its first run wrote it
    assert writes(redis_client) == before
    assert len(delayq.pending(limit=1000)) == 300
    assert journal_events(delayq) == ["scheduled"] * 300


def test_each_micro_batch_is_scheduled_logged_with_its_rejects_and_caches_nothing(
        spark, app, delayq, redis_client, tmp_path, caplog):
    caplog.set_level(logging.INFO, "celery_delayq.spark.streaming")
    for number in range(3):
        write_file(tmp_path / "in", f"orders-{number}.json",
                   range(number * 100, number * 100 + 100), bad=number * 100 + 7)
    persistent = spark.sparkContext._jsc.getPersistentRDDs().size
    cached_before = persistent()
    batches: dict[int, tuple[int, int, int]] = {}
    cached: list[int] = []

    def record(batch_id, summary, rejects):
        batches[batch_id] = (summary.scheduled, summary.existed, summary.rejected)
        cached.append(persistent())

    run_query(spark, app, tmp_path / "in", tmp_path / "checkpoint", record,
              rejects_path=str(tmp_path / "rejects"))

    assert batches == {n: (99, 0, 1) for n in range(3)}
    assert [r.getMessage() for r in caplog.records if r.name.endswith("streaming")] == [
        f"batch {n}: 99 scheduled, 0 existed, 1 rejected (0 with an eta past)"
        for n in range(3)]
    assert cached == [cached_before] * 3
    assert persistent() == cached_before
    rejects = spark.read.parquet(str(tmp_path / "rejects")).collect()
    assert sorted(row.batch_id for row in rejects) == [0, 1, 2]  # a file per batch
    assert sorted(row.n for row in rejects) == [7, 107, 207]
    assert {row.reason for row in rejects} == {"null delay: delay_s is empty"}
    assert len(delayq.pending(limit=1000)) == 297
    # Only the last batch's outcome is kept (for its replay); the others were forgotten.
    outcomes = {key.rsplit(":", 1)[1] for key in redis_client.scan_iter("delayq:*:outcome:*")}
    assert len(outcomes) == 1 and outcomes.pop().endswith("-2")


def test_a_batch_dataframe_or_a_missing_column_is_refused_before_the_query_starts(
        spark, app, delayq, tmp_path):
    static = spark.createDataFrame([("order:1", 1, 600.0)], SCHEMA)
    with pytest.raises(InvalidOption, match="schedule_dataframe"):
        schedule_stream(static, app, checkpoint=str(tmp_path / "c"), **KEYWORDS)

    write_file(tmp_path / "in", "orders.json", range(3))
    df = spark.readStream.schema(SCHEMA).json(str(tmp_path / "in"))
    with pytest.raises(InvalidOption, match="'refund_id' is not a column"):
        schedule_stream(df, app, checkpoint=str(tmp_path / "c"),
                        **{**KEYWORDS, "id_col": "refund_id"})
    assert spark.streams.active == []
    assert delayq.pending() == []


def test_a_new_query_on_a_deleted_checkpoint_at_the_same_path_writes_its_batches_again(
        spark, app, delayq, redis_client, tmp_path):
    import shutil

    write_file(tmp_path / "in", "orders-0.json", range(3))
    seen: list[tuple[int, int]] = []

    def record(batch_id, summary, rejects):
        seen.append((batch_id, summary.scheduled))

    run_query(spark, app, tmp_path / "in", tmp_path / "checkpoint", record)
    for job_id in ("order:0", "order:1", "order:2"):
        delayq.cancel(job_id)  # as when the carrier promoted them and they ran
    shutil.rmtree(tmp_path / "checkpoint")  # reprocess everything: a new query

    run_query(spark, app, tmp_path / "in", tmp_path / "checkpoint", record)

    assert seen == [(0, 3), (0, 3)]
    assert len(delayq.pending()) == 3  # written again, not answered from the old query
