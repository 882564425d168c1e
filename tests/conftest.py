"""Real servers for the tests: one redis-server per session, a real Celery worker on demand.

With ``DELAYQ_TEST_STORE=cluster`` the delay store runs on a real 3-master Redis Cluster
(the broker stays a single Redis, as kombu needs). Unit tests of pure code need neither;
they never touch these fixtures.
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from celery_delayq.testing.redis_server import RedisClusterServer, RedisServer

CLUSTER = os.environ.get("DELAYQ_TEST_STORE") == "cluster"
#: ``make test-fuzz`` sets it to 10: the property-based tests draw ten times their examples
#: (and the stateful store model walks 50 steps instead of 20), which found two store bugs
#: that the short runs of ``make test`` had not (docs/reliability.md).
FUZZ_SCALE = int(os.environ.get("DELAYQ_FUZZ_SCALE", "1"))


def examples(n: int) -> int:
    """``n`` Hypothesis examples, times ``DELAYQ_FUZZ_SCALE``."""
    return n * FUZZ_SCALE

#: Markers of tests that run only when ``-m`` names them, and how to run them.
OPT_IN = {
    "bench": "a benchmark smoke test (about a minute); run it with pytest -m bench",
    "install": "builds and installs the wheel (about a minute); run it with make test-install",
    "slow": "a long fault soak or Spark run (10-40 s); run it with make test-slow",
}


def pytest_collection_modifyitems(config, items) -> None:
    """Skip a test marked with an opt-in marker unless ``-m`` names that marker."""
    chosen = config.option.markexpr or ""
    for item in items:
        for name, how in OPT_IN.items():
            if name not in chosen and item.get_closest_marker(name):
                item.add_marker(pytest.mark.skip(reason=how))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """The broker's Redis (and the store's, unless the store runs on a cluster)."""
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(RedisServer())
        os.environ["DELAYQ_TEST_REDIS_URL"] = server.url
        if CLUSTER:
            cluster = stack.enter_context(RedisClusterServer())
            os.environ["DELAYQ_TEST_STORE_URL"] = cluster.url
        yield server


@pytest.fixture(scope="session")
def proj(redis_server):
    """The test Celery project (``tests/proj.py``) bound to the session's Redis."""
    from tests import proj

    assert redis_server.url == proj.REDIS_URL, "tests.proj was imported before the server"
    yield proj
    # Results waiting in reference cycles unsubscribe from their channel when collected; on
    # Celery 5.3 that retries the connection ~20 s each once the server is gone (at exit).
    gc.collect()


@pytest.fixture
def app(proj, redis_client):
    return proj.app


@pytest.fixture
def delayq(proj, redis_client):
    return proj.delayq


@pytest.fixture
def redis_client(redis_server):
    """A client of the session's Redis, emptied before each test.

    kombu's own bookkeeping (queue bindings, unacked messages) is kept so a session
    worker keeps consuming.
    """
    import redis

    from celery_delayq import journal

    journal.flush()  # a worker's events of the previous test must not land in this one
    client = redis.Redis.from_url(f"{redis_server.url}/0", decode_responses=True)
    stale = [k for k in client.scan_iter(count=1000)
             if not k.startswith(("_kombu", "unacked"))]
    if stale:
        client.delete(*stale)
    if CLUSTER:
        cluster = RedisCluster.from_url(os.environ["DELAYQ_TEST_STORE_URL"].replace(
            "+cluster", ""))
        cluster.flushall(target_nodes=RedisCluster.PRIMARIES)
        cluster.close()
    yield client
    client.close()


def command_calls(store, command: str = "evalsha") -> int:
    """Calls of a command the store's Redis ran so far (every primary's, on a cluster)."""
    client = store.client
    infos = (client.info("commandstats", target_nodes=RedisCluster.PRIMARIES).values()
             if isinstance(client, RedisCluster) else [client.info("commandstats")])
    return sum(info.get(f"cmdstat_{command}", {}).get("calls", 0) for info in infos)


def store_keys(delayq) -> list[str]:
    """Every key of the delay store, on a single Redis or a cluster."""
    return sorted(delayq.store.client.scan_iter(f"{delayq.store.keys.prefix}:*"))


def journal_events(delayq) -> list[str]:
    """Every journaled event name of the store, oldest first."""
    entries = []
    for shard in delayq.store.keys:
        entries.extend(delayq.store.client.xrange(shard.journal))
    entries.sort(key=lambda e: tuple(int(p) for p in e[0].split("-")))
    return [fields["event"] for _, fields in entries]


def wait_for_events(delayq, timeout: float = 15.0, **at_least: int) -> list[str]:
    """The journal's event names once it holds ``at_least`` of each named event, e.g.
    ``promoted=3``: the carrier's ack and the worker's journal thread write theirs a moment
    after the task ran, so a test reads them when they are there; fails with what it saw."""
    deadline = time.monotonic() + timeout
    while True:
        events = journal_events(delayq)
        if all(events.count(name) >= n for name, n in at_least.items()):
            return events
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for journal events {at_least}; "
                        f"the journal has {events}")
        time.sleep(0.02)


#: The carrier's two ways into the broker; a cluster store has only kombu.
PROMOTIONS = ["kombu"] if CLUSTER else ["kombu", "direct"]


@pytest.fixture
def carrier(app, request):
    """A carrier serving in a background thread for the test's duration.

    Parametrize it indirectly with "direct" for direct promotion (default: kombu).
    """
    from celery_delayq.carrier import Carrier

    carrier = Carrier(app, direct=getattr(request, "param", "kombu") == "direct")
    thread = threading.Thread(target=carrier.run, name="carrier", daemon=True)
    thread.start()
    yield carrier
    carrier.stop()
    thread.join(10)


@contextlib.contextmanager
def running_worker(app, **options: Any) -> Iterator[Any]:
    """``celery.contrib.testing.worker.start_worker`` (threads pool) with an event loop of
    its own.

    A worker takes kombu's current event loop, a process global, when one is set. Celery 5.3
    leaves a stopped worker's loop set, so the next worker started in the process shared it
    and never ran a task carrying an ``eta``.

    One app's workers at a time in a process: a worker points Celery's process globals at its
    app (``celery.app.trace.setup_worker_optimizations``: the task registry every worker of
    the process then runs tasks from, and the default app). A second app's worker beside
    the first made both run tasks of one app's registry: the HTTP suite's callbacks ran as
    ``tests.proj``'s, with its settings and store, and never reached the test. Starting one
    beside another app's is refused: run that suite in a pytest process of its own (as
    ``make test`` runs tests/http, tests/django and tests/spark).

    Stopping one stops them all: ``start_worker`` ends its worker through the process global
    ``celery.worker.state.should_terminate``, so a worker started and stopped inside a test
    also ends the session's ``worker`` (later tests of the process then wait for runs that
    never come). Start a second worker only in a process of its own or for the session.
    """
    from celery.contrib.testing.worker import start_worker
    from kombu.asynchronous import set_event_loop

    others = {str(other.main) for other in _WORKER_APPS if other is not app}
    if others:
        raise RuntimeError(
            f"a worker of app {sorted(others)[0]!r} runs in this process, and Celery's "
            f"workers share one app's task registry per process: run the tests that need a "
            f"worker of app {app.main!r} in a pytest process of their own")
    set_event_loop(None)
    _WORKER_APPS.append(app)
    try:
        with start_worker(app, pool="threads", perform_ping_check=False, **options) as worker:
            yield worker
    finally:
        _WORKER_APPS.remove(app)


#: The apps whose workers ``running_worker`` runs in this process now (one app at most).
_WORKER_APPS: list[Any] = []


@pytest.fixture(scope="session")
def worker(proj, redis_server):
    """A real Celery worker (threads pool) consuming the default queue for the session.

    Only that queue, named: Celery 5.3 adds each queue a producer published to to the
    app's queues, and a worker started after a test parked jobs on a queue of its own
    (``parked.*``, which no worker should consume) consumed those too.
    """
    with running_worker(proj.app, queues=[proj.app.conf.task_default_queue], concurrency=4,
                        shutdown_timeout=30) as worker:
        yield worker


def prefork_worker(proj, spawn, name: str, *config: str):
    """A ``tests.proj`` worker of one prefork process on the queue ``name``, named
    ``name@<host>``, once it answers a ping; ``config``: options before ``worker``."""
    worker = spawn(*config, "worker", "-Q", name, "-n", f"{name}@%h", "-P", "prefork",
                   "-c", "1", "--without-heartbeat", "--without-gossip", "--without-mingle",
                   "-l", "INFO")
    wait_for(lambda: answers(proj.app, f"{name}@{socket.gethostname()}"), timeout=30,
             what=f"worker {name}")
    return worker


def answers(app, name: str) -> bool:
    """Whether the worker ``name`` answers a ping; False when the broker connection the app
    kept was closed meanwhile (an earlier test's CLIENT KILL): the next try opens one."""
    try:
        return bool(app.control.ping(destination=[name], timeout=0.5))
    except redis.ConnectionError:
        return False


@contextlib.contextmanager
def sent_natively(app) -> Iterator[None]:
    """Calls of the block take Celery's own way: ``send_task`` leaves their countdown to the
    broker (call ``Task.apply_async`` unbound to skip ``DelayedTask``'s)."""
    import dataclasses

    from celery_delayq import DelayQ

    delayq = DelayQ.of(app)
    config = delayq.config
    delayq.__dict__["config"] = dataclasses.replace(config, route_send_task=False)
    try:
        yield
    finally:
        delayq.__dict__["config"] = config


def wait_for(predicate: Callable[[], object], timeout: float = 15.0,
             interval: float = 0.02, what: str = "condition") -> object:
    """Poll ``predicate`` until it is truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}\n{threads_now()}")
        time.sleep(interval)


def threads_now() -> str:
    """Where each other thread of this process is (its innermost frames): what a worker,
    carrier or server thread was doing when a wait ran out."""
    frames = sys._current_frames()
    lines = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        if thread is threading.current_thread() or frame is None:
            continue
        stack = traceback.format_stack(frame)[-4:]
        lines.append(f"thread {thread.name}:\n{''.join(stack)}")
    return "\n".join(lines)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def celery_cli(*args: str) -> list[str]:
    """argv of ``celery -A tests.proj ...`` with this interpreter."""
    return [sys.executable, "-m", "celery", "-A", "tests.proj", *args]


@pytest.fixture
def spawn(redis_server, tmp_path):
    """Start ``celery -A tests.proj ...`` subprocesses; all are killed at teardown.

    Output goes to a file (a pipe nobody reads would stall a chatty carrier); read it
    with :func:`finish`.
    """
    processes: list[subprocess.Popen] = []

    def start(*args: str) -> subprocess.Popen:
        env = dict(os.environ, DELAYQ_TEST_REDIS_URL=redis_server.url, PYTHONPATH=ROOT)
        log = tmp_path / f"process-{len(processes)}.log"
        with open(log, "w") as out:
            process = subprocess.Popen(celery_cli(*args), cwd=ROOT, env=env, stdout=out,
                                       stderr=subprocess.STDOUT, text=True)
        process.log = log
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def finish(process: subprocess.Popen, timeout: float = 30) -> str:
    """Wait for a spawned process to exit; returns its output."""
    process.wait(timeout)
    return process.log.read_text()
