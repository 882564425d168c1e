"""Do no harm, in real processes: a plain Celery project with celery-delayq installed.

The project neither creates ``DelayQ(app)`` nor uses ``DelayedTask``. Its worker starts
through the ``celery`` command (which loads celery-delayq's ``celery.commands`` entry
point), and its test suite runs under pytest (which loads the ``pytest11`` plugin).
Native countdowns must stay native: run by the worker, nothing written to a delay store.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import redis

from tests.compat.test_do_no_harm_imports import plain_environ
from tests.conftest import wait_for

BIN = os.path.dirname(sys.executable)
DB = 3  # a database of the session's Redis no other suite uses
QUEUE = "plain-compat"
RUNS = "plain:runs"

PLAIN_PROJECT = f'''
"""A Celery project that never heard of celery-delayq."""
import os

import redis
from celery import Celery

URL = os.environ["PLAIN_REDIS_URL"]
app = Celery("plainproj", broker=URL, backend=URL)
app.conf.update(task_default_queue="{QUEUE}", broker_connection_retry_on_startup=True)
runs = redis.Redis.from_url(URL)


@app.task(name="plainproj.record")
def record(label):
    runs.rpush("{RUNS}", label)


@app.task(bind=True, name="plainproj.retry_once", max_retries=1)
def retry_once(self):
    if self.request.retries == 0:
        raise self.retry(countdown=0.3)
    runs.rpush("{RUNS}", "retry")


@app.task(name="plainproj.start")
def start():
    record.apply_async(["countdown"], countdown=0.3)
    app.send_task("plainproj.record", ["send_task"], countdown=0.3)
    retry_once.delay()
'''


@pytest.fixture
def plain_redis(redis_server):
    client = redis.Redis.from_url(f"{redis_server.url}/{DB}", decode_responses=True)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def test_native_countdowns_of_a_plain_apps_worker_run_there_and_nothing_is_stored(
        plain_redis, redis_server, tmp_path):
    (tmp_path / "plainproj.py").write_text(PLAIN_PROJECT)
    env = dict(plain_environ(), PYTHONPATH=str(tmp_path),
               PLAIN_REDIS_URL=f"{redis_server.url}/{DB}")
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        worker = subprocess.Popen(
            [f"{BIN}/celery", "-A", "plainproj", "worker", "-P", "threads", "-c", "2",
             "-Q", QUEUE, "--without-gossip", "--without-mingle", "--without-heartbeat",
             "-l", "INFO"], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        # The producer is a `celery` command too: a countdown from outside, then the task
        # that makes a countdown, a retry and a send_task from inside the worker.
        for argv in (["plainproj.record", "--args", '["producer"]', "--countdown", "0.3"],
                     ["plainproj.start"]):
            subprocess.run([f"{BIN}/celery", "-A", "plainproj", "call", *argv], cwd=tmp_path,
                           env=env, check=True, capture_output=True, timeout=60)
        expected = ["countdown", "producer", "retry", "send_task"]
        try:
            wait_for(lambda: sorted(plain_redis.lrange(RUNS, 0, -1)) == expected, timeout=30)
        except pytest.fail.Exception:
            pytest.fail(f"ran {sorted(plain_redis.lrange(RUNS, 0, -1))}, not {expected}; "
                        f"worker log:\n{log.read_text()[-3000:]}")
    finally:
        worker.terminate()
        worker.wait(30)
    assert [key for key in plain_redis.scan_iter() if key.startswith("delayq")] == []


PLAIN_TESTS = '''
"""A plain project's own tests on memory://, with Celery's pytest fixtures."""
import pytest
from celery import Celery

pytest_plugins = ["celery.contrib.pytest"]


@pytest.fixture(scope="session")
def celery_config():
    return {"broker_url": "memory://", "result_backend": "cache+memory://",
            "broker_transport_options": {"polling_interval": 0.05}}


@pytest.fixture(scope="session")
def celery_worker_parameters():
    return {"perform_ping_check": False}


def test_a_task_runs_on_the_test_worker(celery_app, celery_worker):
    @celery_app.task(name="plain.add")
    def add(x, y):
        return x + y

    celery_worker.reload()
    assert add.delay(2, 3).get(timeout=10) == 5
    assert add.apply_async((1, 1), countdown=0.2).get(timeout=10) == 2
    assert celery_app.send_task("plain.add", (4, 4)).get(timeout=10) == 8


def test_a_finalized_app_sends_on_memory_broker():
    app = Celery("plain", broker="memory://", set_as_current=False)
    app.finalize()
    assert app.send_task("plain.anything").id
    assert app.send_task("plain.anything", countdown=5).id
'''


def test_a_plain_projects_memory_broker_test_suite_passes_with_the_plugin_installed(tmp_path):
    (tmp_path / "test_plain.py").write_text(PLAIN_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = plain_environ()
    run = subprocess.run(
        [f"{BIN}/pytest", "-q", "-p", "no:cacheprovider", "--trace-config", "--rootdir",
         str(tmp_path), str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=110)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "2 passed" in run.stdout
    assert "PLUGIN registered: <module 'celery_delayq.testing.pytest_plugin'" in run.stdout
