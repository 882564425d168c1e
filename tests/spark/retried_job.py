"""A schedule_dataframe run whose every task fails once after writing part of its rows
(``python -m tests.spark.retried_job REDIS_URL``): Spark runs each task again. Prints the
summary as JSON."""

from __future__ import annotations

import json
import sys

from pyspark import TaskContext
from pyspark.sql import functions as F

from celery_delayq.spark import schedule_dataframe
from tests.spark.jobs import session

ROWS, PARTITIONS = 16_000, 4


def main(redis_url: str) -> None:
    spark, app = session(  # rows reach the writer 500 at a time: written rows precede the loss
        "retried", redis_url, **{"spark.sql.execution.arrow.maxRecordsPerBatch": "500"})

    @F.udf("long")
    def lost_once(n: int) -> int:
        """The first attempt of every task dies at its partition's 3,600th row, in the
        count of duplicate ids and in the write; the write's records how many jobs were
        stored by then (earlier rows have been written)."""
        context = TaskContext.get()
        if context.attemptNumber() == 0 and n % (ROWS // PARTITIONS) == 3_600:
            import redis

            client = redis.Redis.from_url(f"{redis_url}/0")
            if context.getLocalProperty("spark.jobGroup.id").startswith("delayq-schedule"):
                client.rpush("test:lost", context.partitionId())
                client.rpush("test:stored", sum(client.zcard(key)
                                                for key in client.scan_iter("delayq:*:due")))
            raise RuntimeError("executor lost")
        return n

    df = (spark.range(0, ROWS, numPartitions=PARTITIONS)
          .withColumn("n", lost_once("id"))
          .withColumn("job", F.concat(F.lit("retried:"), F.col("n").cast("string")))
          .withColumn("delay_s", F.lit(3600.0)))
    summary, rejects = schedule_dataframe(df, app, task="tests.proj.record", id_col="job",
                                          delay_col="delay_s", args_cols=["n"],
                                          batch_size=500)
    print(json.dumps({"scheduled": summary.scheduled, "existed": summary.existed,
                      "rejected": summary.rejected, "rejects": rejects.count()}))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
