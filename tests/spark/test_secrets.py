"""The store's password stays out of Spark: its conf, the UI's Environment tab, job and
stage descriptions, plans and the event log; the CLI takes it without the command line.

Every run writes to a real ``requirepass`` redis-server, so the password is the one that
works, and everything Spark recorded is grepped for it.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis

from celery_delayq.spark import __main__ as spark_main
from celery_delayq.spark.__main__ import main
from celery_delayq.testing.redis_server import RedisServer, free_port
from tests.conftest import ROOT

PASSWORD = "pw" + secrets.token_hex(8)


@pytest.fixture(scope="module")
def locked() -> Iterator[RedisServer]:
    with RedisServer(extra=("--requirepass", PASSWORD)) as server:
        yield server


@pytest.fixture
def refunds(tmp_path) -> str:
    path = tmp_path / "refunds.csv"
    path.write_text("refund_id,delay_s\n" + "".join(f"r{n},600\n" for n in range(20)))
    return str(path)


def stored(server: RedisServer) -> int:
    client = redis.Redis(port=server.port, password=PASSWORD)
    try:
        return sum(client.zcard(key) for key in client.scan_iter("delayq:*:due"))
    finally:
        client.flushall()
        client.close()


def schedule_args(refunds: str, *extra: str) -> list[str]:
    return ["schedule", "--input", refunds, "--format", "csv", "--task", "shop.refund",
            "--id-col", "refund_id", "--delay-col", "delay_s", "--set", "delayq_shards=2",
            *extra]


@pytest.mark.slow
def test_spark_submit_keeps_the_password_out_of_the_conf_the_ui_and_the_event_log(
        locked, refunds, tmp_path):
    """The package's own __main__.py, submitted as docs/spark.md says, on spark-submit's
    master; the event log holds the driver's whole conf (the UI's Environment tab)."""
    url = f"redis://:{PASSWORD}@127.0.0.1:{locked.port}/0"
    script = spark_main.__file__
    events = tmp_path / "events"
    events.mkdir()
    bin_dir = os.path.dirname(sys.executable)
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable, CELERY_BROKER_URL=url)
    run = subprocess.run(
        [os.path.join(bin_dir, "spark-submit"), "--master", "local[2]",
         "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.bindAddress=127.0.0.1",
         "--conf", "spark.eventLog.enabled=true", "--conf", "spark.eventLog.compress=false",
         "--conf", f"spark.eventLog.dir={events.as_uri()}",
         # the operator's own redaction pattern is kept, and extended
         "--conf", "spark.redaction.regex=internal", "--conf", "spark.internal.id=42",
         script,
         # the broker from the environment, the store's URL on the command line
         *schedule_args(refunds, "--set", f"delayq_redis_url={url}")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=110)

    assert run.returncode == 0, run.stderr[-3000:]
    assert "scheduled 20, already existed 0, rejected 0" in run.stdout
    assert stored(locked) == 20
    # spark-submit passes the driver's stderr on to its stdout
    assert "warning: --set delayq_redis_url holds a password" in run.stdout
    log = "".join(p.read_text() for p in events.rglob("*") if p.is_file())
    assert '"Event":"SparkListenerEnvironmentUpdate"' in log
    assert '"spark.job.description":"celery-delayq: schedule shop.refund' in log
    assert "SparkListenerSQLExecutionStart" in log  # with the plans
    assert '"spark.master":"local[2]"' in log  # spark-submit's, not local[*]
    assert '"spark.internal.id":"*********(redacted)"' in log
    assert PASSWORD not in log
    assert PASSWORD not in run.stdout + run.stderr  # Spark's INFO lines included


def test_schedule_command_takes_the_url_from_a_file_or_the_environment_without_warning(
        spark, locked, refunds, tmp_path, monkeypatch, capsys):
    url = f"redis://127.0.0.1:{locked.port}/0?password={PASSWORD}"
    secret_file = tmp_path / "broker-url"
    secret_file.write_text(url + "\n")
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    assert main(schedule_args(refunds, "--broker-file", str(secret_file))) == 0
    assert stored(locked) == 20

    monkeypatch.setenv("CELERY_BROKER_URL", url)
    assert main(schedule_args(refunds)) == 0
    assert stored(locked) == 20

    out, err = capsys.readouterr()
    assert "warning" not in err and PASSWORD not in out + err
    assert PASSWORD not in repr(spark.sparkContext.getConf().getAll())
    assert PASSWORD not in str(spark.sparkContext.getLocalProperty("spark.job.description"))


def test_a_password_given_with_broker_is_used_with_a_warning_about_ps(
        spark, locked, refunds, capsys):
    url = f"redis://default:{PASSWORD}@127.0.0.1:{locked.port}/0"
    assert main(schedule_args(refunds, "--broker", url)) == 0
    assert stored(locked) == 20
    err = capsys.readouterr().err
    assert "warning: --broker holds a password" in err and "`ps`" in err
    assert "CELERY_BROKER_URL" in err and "--broker-file" in err
    assert PASSWORD not in err


def test_a_store_password_given_with_set_is_used_with_a_warning_about_ps(
        spark, locked, refunds, monkeypatch, capsys):
    monkeypatch.setenv("CELERY_BROKER_URL", f"redis://127.0.0.1:{locked.port}/0")
    assert main(schedule_args(refunds, "--set", f"delayq_redis_password={PASSWORD}")) == 0
    assert stored(locked) == 20
    err = capsys.readouterr().err
    assert "warning: --set delayq_redis_password holds a password" in err and "`ps`" in err
    assert PASSWORD not in err
    assert PASSWORD not in repr(spark.sparkContext.getConf().getAll())


def test_a_failed_write_on_the_executors_never_shows_the_password(spark, refunds, capsys):
    url = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    with pytest.raises(Exception) as raised:  # the Spark job fails, as it should
        main(schedule_args(refunds, "--set", "delayq_redis_retries=0", "--broker", url))
    printed = str(raised.value) + "".join(capsys.readouterr())
    assert "unavailable" in printed and "***@127.0.0.1" in printed
    assert PASSWORD not in printed
