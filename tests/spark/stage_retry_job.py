"""A schedule_dataframe run whose input is shuffled and loses its shuffle files mid-write
(``python -m tests.spark.stage_retry_job REDIS_URL``): the first attempt of every task
after the shuffle deletes the shuffle files and fails at its 900th row, so Spark runs
the task again, finds the files gone, and runs the shuffle's stage and the write's stage
again (a stage retry; each stage's partition fails once). Prints the progress reports,
then the summary, as JSON lines."""

from __future__ import annotations

import glob
import json
import os
import sys
import tempfile

from pyspark import TaskContext
from pyspark.sql import functions as F

from celery_delayq.spark import schedule_dataframe
from tests.spark.jobs import session

ROWS, PARTITIONS = 4_000, 4
_seen: dict[int, int] = {}  # task attempt id -> rows it has seen (in this Python worker)


def main(redis_url: str) -> None:
    local_dir = tempfile.mkdtemp(prefix="delayq-stage-retry-")  # the shuffle files' place
    # Each partition's first attempt fails the write stage once; when they fall in separate
    # attempts, that is 4 in a row, Spark's default limit before it aborts the job.
    spark, app = session("stage-retry", redis_url, **{
        "spark.local.dir": local_dir, "spark.stage.maxConsecutiveAttempts": "8"})

    @F.udf("long")
    def shuffle_lost_once(n: int) -> int:
        context = TaskContext.get()
        _seen[context.taskAttemptId()] = seen = _seen.get(context.taskAttemptId(), 0) + 1
        lost = f"{local_dir}/lost-{context.stageId()}-{context.partitionId()}"
        if seen == 900 and not os.path.exists(lost):  # once per stage and partition
            open(lost, "w").close()
            for path in glob.glob(f"{local_dir}/**/shuffle_*", recursive=True):
                os.remove(path)
            raise RuntimeError("executor lost, with its shuffle files")
        return n

    df = (spark.range(0, ROWS, numPartitions=8).repartition(PARTITIONS)
          .withColumn("n", shuffle_lost_once("id"))
          .withColumn("job", F.concat(F.lit("stage-retry:"), F.col("n").cast("string")))
          .withColumn("delay_s", F.lit(3600.0)))
    reports: list[tuple[int, int, int]] = []
    summary, _ = schedule_dataframe(
        df, app, task="tests.proj.record", id_col="job", delay_col="delay_s", args_cols=["n"],
        batch_size=250, progress=lambda p: reports.append(
            (p.partitions_done, p.partitions, p.rows_done)))
    print(json.dumps(reports))
    print(json.dumps({"scheduled": summary.scheduled, "existed": summary.existed,
                      "rejected": summary.rejected}))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
