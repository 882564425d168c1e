"""A schedule_dataframe run whose every task fails once after writing part of its rows
(``python -m tests.spark.retried_job REDIS_URL``): Spark runs each task again. Prints the
summary as JSON."""

from __future__ import annotations

import json
import os
import sys

from celery import Celery
from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from celery_delayq.spark import schedule_dataframe

ROWS, PARTITIONS = 16_000, 4


def main(redis_url: str) -> None:
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2,2]")  # a task may fail once
             .config("spark.ui.enabled", "false")
             .config("spark.driver.bindAddress", "127.0.0.1")
             # rows reach the writer 500 at a time: written rows precede the loss
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("OFF")
    app = Celery("retried", broker=f"{redis_url}/0", set_as_current=False)
    app.conf.delayq_shards = 4

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
