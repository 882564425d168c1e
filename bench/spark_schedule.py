"""Bulk scheduling throughput: ``schedule_dataframe`` on Spark vs the single-process bulk API.

Both arms write the same rows (job id, 1-hour delay, two arguments) to one fresh
redis-server, one after the other, with the store emptied in between. rows/s is end to end:
for Spark from the ``schedule_dataframe`` call to its return (the session is started before
the clock runs), for ``DelayQ.schedule_many`` from building the first item to the last
reply. Run ``python -m bench.spark_schedule [--rows N] [--master local[2]]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from celery import Celery

from celery_delayq import DelayQ
from celery_delayq.testing.redis_server import RedisServer

from .output import RESULTS

TASK = "shop.tasks.check_refund_status"
DELAY_S = 3600.0


def _app(url: str, shards: int) -> Celery:
    app = Celery("bench-spark", broker=f"{url}/0", set_as_current=False)
    app.conf.update(task_default_queue="celery", delayq_shards=shards)
    return app


def _pending(delayq: DelayQ) -> int:
    return sum(row["pending"] for row in delayq.store.stats())


def _redis_cpu_s(app: Celery) -> float:
    """CPU seconds redis-server has used so far (user + system)."""
    cpu = DelayQ(app).store.client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _measured(app: Celery, arm, *args) -> dict:
    """Run an arm; add the Redis CPU it cost, per row in microseconds."""
    before = _redis_cpu_s(app)
    result = arm(app, *args)
    result["redis_cpu_us_per_row"] = (_redis_cpu_s(app) - before) / result["rows"] * 1e6
    return result


def bulk_api(app: Celery, rows: int, chunk: int) -> dict:
    """``DelayQ.schedule_many`` in chunks from this process."""
    delayq = DelayQ(app)
    started = time.perf_counter()
    for start in range(0, rows, chunk):
        delayq.schedule_many(TASK, [
            {"job_id": f"refund:{n}", "delay": DELAY_S, "args": [f"refund:{n}", n]}
            for n in range(start, min(start + chunk, rows))])
        done = min(start + chunk, rows)
        if done % (rows // 10 or 1) < chunk:
            elapsed = time.perf_counter() - started
            print(f"  bulk api: {done:,}/{rows:,} rows, {elapsed:.1f}s "
                  f"({done / elapsed:,.0f} rows/s)", flush=True)
    seconds = time.perf_counter() - started
    stored = _pending(delayq)
    delayq.store.close()
    return {"arm": "DelayQ.schedule_many (1 process)", "rows": rows, "seconds": seconds,
            "rows_per_s": rows / seconds, "stored": stored}


def spark_arm(app: Celery, rows: int, master: str, partitions: int,
              batch_size: int) -> dict:
    """``schedule_dataframe`` on a local Spark session."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from celery_delayq.spark import PartitionProgress, schedule_dataframe

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    boot = time.perf_counter()
    spark = (SparkSession.builder.master(master).appName("celery-delayq bench")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    boot = time.perf_counter() - boot
    df = (spark.range(rows, numPartitions=partitions)
          .withColumn("refund_id", F.concat(F.lit("refund:"), F.col("id").cast("string")))
          .withColumn("delay_s", F.lit(DELAY_S)))

    def progress(p: PartitionProgress) -> None:
        print(f"  spark: partitions {p.partitions_done}/{p.partitions} done, "
              f"{p.rows_done:,} rows written, {p.elapsed:.1f}s", flush=True)

    started = time.perf_counter()
    summary, rejects = schedule_dataframe(
        df, app, task=TASK, id_col="refund_id", delay_col="delay_s",
        args_cols=["refund_id", "id"], batch_size=batch_size, progress=progress)
    seconds = time.perf_counter() - started
    rejected = rejects.count()
    spark.stop()
    stored = _pending(DelayQ(app))
    return {"arm": f"schedule_dataframe ({master}, {partitions} partitions)", "rows": rows,
            "seconds": seconds, "rows_per_s": rows / seconds, "stored": stored,
            "scheduled": summary.scheduled, "existed": summary.existed,
            "rejected": rejected, "spark_startup_s": boot}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=5000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=10_000,
                        help="Items per schedule_many call in the bulk-API arm.")
    parser.add_argument("--out", type=Path, default=RESULTS / "spark_schedule.json")
    args = parser.parse_args(argv)

    results = []
    load_before = os.getloadavg()
    with RedisServer() as server:
        app = _app(server.url, args.shards)
        flush = DelayQ(app).store.client.flushall
        print(f"bulk API: {args.rows:,} rows", flush=True)
        results.append(_measured(app, bulk_api, args.rows, args.chunk))
        flush()
        print(f"spark {args.master}: {args.rows:,} rows", flush=True)
        results.append(_measured(app, spark_arm, args.rows, args.master, args.partitions,
                                 args.batch_size))
    for result in results:
        if result["stored"] != args.rows:
            print(f"error: {result['arm']} stored {result['stored']:,} of {args.rows:,}",
                  file=sys.stderr)
            return 1

    print(f"\n{'arm':<48} {'rows':>10} {'seconds':>8} {'rows/s':>10} {'redis us/row':>13}")
    for r in results:
        print(f"{r['arm']:<48} {r['rows']:>10,} {r['seconds']:>8.1f} {r['rows_per_s']:>10,.0f}"
              f" {r['redis_cpu_us_per_row']:>13.1f}")
    print(f"(spark session start-up, not counted: {results[1]['spark_startup_s']:.1f}s)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "spark_schedule", "task": TASK, "delay_s": DELAY_S,
        "shards": args.shards, "batch_size": args.batch_size,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(),
                    "load_average_before_after": [load_before, os.getloadavg()]},
        "results": results}, indent=2))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
