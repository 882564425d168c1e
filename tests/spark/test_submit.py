"""spark-submit on a real standalone master: the bulk schedule job runs as that master's
application, as docs/spark.md documents it.

A master and one worker are started from the pyspark wheel's own classes on loopback;
the package's ``__main__.py`` is submitted by path with the broker URL in the environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_delayq.spark import __main__ as spark_main
from celery_delayq.testing.redis_server import free_port
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

APP_NAME = "celery-delayq schedule shop.refund"


def _state(webui: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{webui}/json", timeout=5) as reply:
        return json.load(reply)


def _wait(what: str, check, timeout: float = 45.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = check()
        except OSError:
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


@pytest.fixture(scope="module")
def standalone(tmp_path_factory) -> Iterator[tuple[str, int]]:
    """A standalone master and one worker (1 core, 512 MB): (master URL, master web UI port)."""
    import pyspark

    home = os.path.dirname(pyspark.__file__)
    env = dict(os.environ, SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1",
               SPARK_DAEMON_MEMORY="256m", PYSPARK_PYTHON=sys.executable)
    port, webui = free_port(), free_port()
    logs = tmp_path_factory.mktemp("standalone")
    with contextlib.ExitStack() as stack:
        def start(name: str, *args: str) -> None:
            log = stack.enter_context(open(logs / f"{name}.log", "wb"))
            process = subprocess.Popen([os.path.join(home, "bin", "spark-class"), *args],
                                       env=env, stdout=log, stderr=subprocess.STDOUT)
            stack.callback(_stop, process)

        start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
              "--port", str(port), "--webui-port", str(webui))
        # the worker retries until the master listens
        start("worker", "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
              "--host", "127.0.0.1", "--webui-port", str(free_port()), "--cores", "1",
              "--memory", "512m", "--work-dir", str(logs / "work"))
        _wait("an alive worker", lambda: _state(webui).get("aliveworkers"))
        yield f"spark://127.0.0.1:{port}", webui


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def test_spark_submit_runs_the_schedule_job_as_an_application_of_the_master(
        standalone, redis_server, redis_client, tmp_path):
    master, webui = standalone
    source = Path(tmp_path / "refunds.csv")
    source.write_text("refund_id,delay_s\n" + "".join(f"r{n},600\n" for n in range(500)))
    bin_dir = os.path.dirname(sys.executable)
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1",
               CELERY_BROKER_URL=f"{redis_server.url}/0")  # the secret: never in argv
    run = subprocess.run(
        [os.path.join(bin_dir, "spark-submit"), "--master", master,
         "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.host=127.0.0.1",
         "--conf", "spark.driver.bindAddress=127.0.0.1", "--conf", "spark.executor.memory=512m",
         "--conf", "spark.cores.max=1",
         spark_main.__file__, "schedule", "--input", str(source), "--format", "csv",
         "--task", "shop.refund", "--id-col", "refund_id", "--delay-col", "delay_s",
         "--set", "delayq_shards=4"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100)

    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "scheduled 500, already existed 0, rejected 0" in run.stdout
    (app,) = _wait("the completed application",
                   lambda: [a for a in _state(webui)["completedapps"] if a["name"] == APP_NAME])
    assert app["state"] == "FINISHED" and app["cores"] == 1
    assert sum(redis_client.zcard(key) for key in redis_client.scan_iter("delayq:*:due")) == 500
