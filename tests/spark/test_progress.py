"""schedule_dataframe's progress callback counts each partition once, with its rows, and
never goes back, whatever Spark runs again."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.spark.stage_retry_job import PARTITIONS, ROWS

pytestmark = pytest.mark.slow


def test_progress_counts_each_partition_once_and_never_goes_back_after_a_stage_retry(
        redis_server, redis_client):
    run = subprocess.run([sys.executable, "-m", "tests.spark.stage_retry_job",
                          redis_server.url], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    *_, progress, summary = run.stdout.strip().splitlines()
    reports = [tuple(report) for report in json.loads(progress)]

    assert json.loads(summary)["scheduled"] == ROWS
    assert reports[-1] == (PARTITIONS, PARTITIONS, ROWS)
    assert reports == sorted(set(reports))  # no report twice, none lower than the one before
    # Partitions count when their rows do (written by the write stage), each once.
    assert all(done <= PARTITIONS and (done == 0) == (rows == 0)
               for done, _, rows in reports), reports
