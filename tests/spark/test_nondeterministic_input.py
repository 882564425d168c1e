"""An input column computed anew on every read (a Python UDF with random()) still gets
one row written per id, and every reject the summary counts comes back."""

from __future__ import annotations

import logging

from celery_delayq.spark import schedule_dataframe

TASK = "tests.proj.anything"


def _jittered(spark, ids, *extra):
    """200 rows whose delay a Python UDF draws at random each time Spark computes it, and
    ``extra`` columns of ``spark.range``'s ``id``."""
    from pyspark.sql import functions as F

    @F.udf("double")
    def jitter(n):
        import random

        return 3600.0 + random.random() * 60

    return spark.range(0, 200, numPartitions=2).select(ids.alias("job"), jitter("id").alias("d"),
                                                       *extra)


def test_a_duplicated_id_with_a_random_column_has_exactly_one_row_written(spark, app,
                                                                          delayq):
    from pyspark.sql import functions as F

    df = _jittered(spark, F.concat(F.lit("dup:"), (F.col("id") % 100).cast("string")))
    summary, rejects = schedule_dataframe(df, app, task=TASK, id_col="job", delay_col="d")

    assert (summary.scheduled, summary.existed, summary.rejected) == (100, 0, 100)
    assert len(delayq.pending(limit=1_000)) == 100
    lost = rejects.collect()
    assert sorted(row.job for row in lost) == sorted(f"dup:{n}" for n in range(100))
    assert all(row.reason.startswith("duplicate id in input") for row in lost)


def test_every_counted_reject_comes_back_when_the_input_reads_differently(spark, app,
                                                                          delayq, caplog):
    """The rejects' lookup matches rows by their used columns; a row that reads
    differently the second time is still returned, from the columns the write saw, and
    the call says why its other columns may be missing."""
    from pyspark.sql import functions as F

    df = _jittered(spark, F.when(F.col("id") % 10 == 0, F.lit(None))
                   .otherwise(F.col("id").cast("string")))
    with caplog.at_level(logging.WARNING, "celery_delayq.spark.schedule"):
        summary, rejects = schedule_dataframe(df, app, task=TASK, id_col="job",
                                              delay_col="d")

    assert (summary.scheduled, summary.rejected) == (180, 20)
    lost = rejects.collect()
    assert len(lost) == 20
    assert all(row.job is None and row.reason.startswith("null id") for row in lost)
    assert all(3600.0 <= row.d < 3660.0 for row in lost)  # as the write read them
    assert "not deterministic" in caplog.text


def _null_ids_of_every_tenth_row():
    from pyspark.sql import functions as F

    return F.when(F.col("id") % 10 == 0, F.lit(None)).otherwise(F.col("id").cast("string"))


def test_rejects_not_found_again_come_back_with_a_non_nullable_unused_column_null(
        spark, app, delayq, caplog):
    df = _jittered(spark, _null_ids_of_every_tenth_row(), "id")  # id: long, not nullable
    with caplog.at_level(logging.WARNING, "celery_delayq.spark.schedule"):
        summary, rejects = schedule_dataframe(df, app, task=TASK, id_col="job",
                                              delay_col="d")

    assert (summary.scheduled, summary.rejected) == (180, 20)
    lost = rejects.collect()
    assert len(lost) == 20 and all(row.id is None for row in lost)
    assert "not deterministic" in caplog.text


def test_rejects_not_found_again_come_back_with_a_map_of_non_string_keys_null(
        spark, app, delayq, caplog):
    from pyspark.sql import functions as F

    kwargs = F.create_map(F.col("id").cast("int"), F.lit("v")).alias("kw")
    df = _jittered(spark, _null_ids_of_every_tenth_row(), kwargs)
    with caplog.at_level(logging.WARNING, "celery_delayq.spark.schedule"):
        summary, rejects = schedule_dataframe(df, app, task=TASK, id_col="job",
                                              delay_col="d", kwargs_col="kw")

    assert (summary.scheduled, summary.rejected) == (180, 20)
    lost = rejects.collect()
    assert len(lost) == 20 and all(row.kw is None and 3600 <= row.d < 3660 for row in lost)
    assert "not deterministic" in caplog.text
