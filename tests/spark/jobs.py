"""What the Spark jobs the tests run in a subprocess share (a task there may fail once)."""

from __future__ import annotations

import os
import sys

from celery import Celery
from pyspark.sql import SparkSession


def session(name: str, redis_url: str, **conf: str) -> tuple[SparkSession, Celery]:
    """A ``local[2,2]`` session (a task may fail once, then runs again) with ``conf``, and
    a task-less app on ``redis_url`` with 4 shards."""
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = (SparkSession.builder.master("local[2,2]")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.session.timeZone", "UTC"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("OFF")
    app = Celery(name, broker=f"{redis_url}/0", set_as_current=False)
    app.conf.delayq_shards = 4
    return spark, app
