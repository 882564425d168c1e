"""Outages around the store: Redis restarts, a broker that goes away, skewed clocks, a worker
killed mid-task. Each test prints its figures and asserts the guarantee."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis
from celery import Celery

from celery_delayq import DelayedTask, DelayQ, StoreUnavailable
from celery_delayq.carrier import Carrier
from celery_delayq.testing.redis_server import RedisServer
from tests.conftest import ROOT, journal_events, wait_for, wait_for_events

QUEUE = "outage"


def make_app(name: str, broker: str, store: str) -> tuple[Celery, DelayedTask]:
    app = Celery(name, broker=broker, set_as_current=False)
    app.conf.update(delayq_redis_url=store, delayq_shards=4, delayq_redis_retries=2,
                    delayq_redis_socket_timeout=1.0, delayq_lease_seconds=1.0,
                    delayq_shard_lease_seconds=1.0, broker_connection_retry_on_startup=True)

    @app.task(base=DelayedTask, name=f"{name}.noop", shared=False)
    def noop(i):
        return i

    DelayQ(app)
    return app, noop


def delivered_ids(client) -> list[str]:
    import json

    return [json.loads(raw)["headers"]["delayq_job"] for raw in client.lrange(QUEUE, 0, -1)]


def run_carrier(app):
    carrier = Carrier(app)
    thread = threading.Thread(target=carrier.run, daemon=True)
    thread.start()
    return carrier, thread


def settled(delayq) -> bool:
    return all(row["pending"] == 0 and row["inflight"] == 0 for row in delayq.store.stats())


def test_redis_restart_during_a_burst_delivers_every_accepted_call(redis_server, redis_client):
    store = RedisServer(appendonly=True, extra=("--appendfsync", "always")).start()
    try:
        app, noop = make_app("restart", f"{redis_server.url}/0", store.url)
        accepted: list[str] = []
        refused: list[tuple[float, str]] = []
        stop = threading.Event()

        def burst():
            i = 0
            while not stop.is_set():
                started = time.monotonic()
                try:
                    accepted.append(noop.apply_delayed(args=(i,), delay=0.5, queue=QUEUE,
                                                       job_id=f"burst-{i}").job_id)
                except StoreUnavailable as exc:
                    refused.append((time.monotonic() - started, str(exc)))
                    time.sleep(0.05)
                i += 1

        producer = threading.Thread(target=burst)
        producer.start()
        time.sleep(0.5)
        store.stop()
        time.sleep(1.0)
        store.start()  # same port and directory: the AOF is replayed
        time.sleep(0.5)
        stop.set()
        producer.join()

        carrier, thread = run_carrier(app)
        wait_for(lambda: settled(DelayQ.of(app)), timeout=30, what="the burst delivered")
        carrier.stop()
        thread.join(10)
        delivered = set(delivered_ids(redis_client))
        slowest = max(seconds for seconds, _ in refused)
        print(f"\naccepted={len(accepted)} refused={len(refused)} lost="
              f"{len(set(accepted) - delivered)} slowest-refusal={slowest:.2f}s")
        assert refused, "no call fell into the outage"
        assert set(accepted) <= delivered
        assert slowest < 5.0, "a call during the outage hung"
        assert "is unavailable after 2 retries" in refused[0][1]
    finally:
        store.close()


def test_broker_outage_while_publishing_loses_nothing_and_logs_once(
        redis_server, redis_client, caplog):
    broker = RedisServer().start()
    try:
        app, noop = make_app("brokerdown", f"{broker.url}/0", f"{redis_server.url}/0")
        jobs = {r.job_id for r in noop.apply_delayed_many(
            [{"args": (i,), "delay": 0} for i in range(2000)], queue=QUEUE)}
        broker.stop()
        with caplog.at_level(logging.INFO, logger="celery_delayq.carrier"):
            carrier, thread = run_carrier(app)
            time.sleep(8)  # publishing fails (after kombu's own ~6 s of connect retries)
            broker.start()
            wait_for(lambda: settled(DelayQ.of(app)), timeout=60, what="delivery after outage")
            carrier.stop()
            thread.join(10)
        import redis

        delivered = delivered_ids(redis.Redis.from_url(f"{broker.url}/0", decode_responses=True))
        paused = [r for r in caplog.records if "carrier paused" in r.getMessage()]
        print(f"\njobs={len(jobs)} lost={len(jobs - set(delivered))} "
              f"duplicates={len(delivered) - len(set(delivered))} outage-logs={len(paused)}")
        assert set(delivered) == jobs
        assert len(paused) == 1, [r.getMessage() for r in paused]
    finally:
        broker.close()


def test_skewed_producer_and_carrier_clocks_follow_redis_time(proj, delayq, redis_client, spawn):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([
        os.path.join(ROOT, "tests", "faults", "skewed_clock"), ROOT]))
    carrier_env = dict(env, DELAYQ_TEST_CLOCK_SKEW="-30")
    carrier = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.proj", "delayq", "carrier"],
        cwd=ROOT, env=carrier_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def redis_ms() -> int:
        seconds, micros = redis_client.time()
        return seconds * 1000 + micros // 1000

    try:
        before = redis_ms()
        subprocess.run(
            [sys.executable, "-c", "from tests.proj import record\n"
             "record.apply_delayed_many([{'args': (i,), 'delay': 2, 'job_id': f'skew-{i}'} "
             "for i in range(20)], queue='parked')"],
            cwd=ROOT, env=dict(env, DELAYQ_TEST_CLOCK_SKEW="30"), check=True)
        after = redis_ms()
        due = [delayq.get(f"skew-{i}").due.timestamp() * 1000 for i in range(20)]
        wait_for(lambda: redis_client.llen("parked") == 20, timeout=20, what="skewed delivery")
    finally:
        carrier.send_signal(signal.SIGTERM)
        carrier.wait(20)
    promoted = {}
    for shard in delayq.store.keys:
        for entry_id, fields in delayq.store.client.xrange(shard.journal):
            if fields["event"] == "promoted":
                promoted[fields["job"]] = int(entry_id.split("-")[0]) - int(fields["due"])
    print(f"\nproducer +30s, carrier -30s: due - Redis time of the call "
          f"{min(due) - before:.0f}..{max(due) - before:.0f} ms (call took {after - before} ms),"
          f" promotion lateness {min(promoted.values())}..{max(promoted.values())} ms")
    # due = Redis time during the call + 2 s: neither clock's 30 s shows up
    assert all(before + 2000 <= d <= after + 2000 for d in due)
    # promoted on Redis time: not 30 s early or late (a loaded machine may add seconds)
    assert len(promoted) == 20 and all(0 <= late <= 5000 for late in promoted.values())


def test_worker_killed_mid_task_with_acks_late_runs_it_again(proj, delayq, redis_client, spawn):
    env_visibility = {"DELAYQ_TEST_VISIBILITY": "2"}
    os.environ.update(env_visibility)
    try:
        worker_args = ("worker", "-Q", "late", "-P", "solo", "--without-heartbeat",
                       "--without-gossip", "--without-mingle", "-l", "INFO")
        first = spawn(*worker_args)
        spawn("delayq", "carrier")
        result = proj.slow.apply_delayed(args=("late",), delay=0.2, queue="late")
        wait_for(lambda: any(r["label"] == "late" for r in proj.runs()), timeout=30,
                 what="the task to start")
        # The worker's journal thread writes "started" while the task runs, not before it
        # (no round trip in the task's path): kill once it is there, mid-task.
        wait_for(lambda: "started" in journal_events(delayq), timeout=10,
                 what="the first run's started event")
        started = time.monotonic()
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        # A worker sweeps unacked messages past the visibility timeout when it starts, then
        # on a timer that on kombu 5.3 scans only every 100 s (each 10th call of a 10 s
        # timer). Start the next worker once the message is past it.
        time.sleep(max(0.0, started + 2.5 - time.monotonic()))
        spawn(*worker_args)
        assert result.get(timeout=60) == "late"
    finally:
        for name in env_visibility:
            os.environ.pop(name)
    starts = [r for r in proj.runs() if r["label"] == "late"]
    events = wait_for_events(delayq, succeeded=1, started=2)
    print(f"\nruns={len(starts)} journal={events}")
    assert len(starts) == 2 and {r["task_id"] for r in starts} == {result.id}
    assert events.count("started") == 2 and events.count("succeeded") == 1


def test_a_read_only_replica_refuses_every_write_with_an_error_that_names_the_fix():
    """A store URL that names a replica (a master a failover demoted, without Sentinel):
    every write is refused with ``StoreUnavailable`` saying to point the URL at the master,
    not a raw ``ReadOnlyError``; the password stays out of it."""
    password = "ro-test-password"
    with RedisServer(extra=("--requirepass", password)) as server:
        admin = redis.Redis(port=server.port, password=password)
        admin.replicaof("127.0.0.1", 1)  # a master that never answers: writes are refused
        app, noop = make_app("readonly", f"{server.url}/0",
                             f"redis://:{password}@127.0.0.1:{server.port}/0")
        delayq = DelayQ.of(app)
        writes = {
            "apply_delayed": lambda: noop.apply_delayed(args=(1,), delay=60),
            "own job id": lambda: noop.apply_delayed(args=(1,), delay=60, job_id="j"),
            "apply_delayed_many": lambda: noop.apply_delayed_many(
                [{"args": (n,), "delay": 60} for n in range(20)]),
            "cancel": lambda: delayq.cancel("j"),
            "cancel_key": lambda: delayq.cancel_key("order:1"),
            "pause": lambda: delayq.pause(task=noop.name),
        }
        for name, write in writes.items():
            with pytest.raises(StoreUnavailable) as refused:
                write()
            message = str(refused.value)
            assert "read-only replica" in message and "delayq_redis_url" in message, name
            assert password not in message and ":***@" in message, name
        admin.replicaof("no", "one")
        assert noop.apply_delayed(args=(1,), delay=60).job_id
        delayq.store.close()


def test_a_redis_short_of_replicas_refuses_writes_as_unavailable_and_stores_nothing():
    """``min-replicas-to-write`` with fewer replicas in sync (a replica lost): Redis refuses
    every write (``NOREPLICAS``; Redis 6.2 inside a script's error). Each write raises
    ``StoreUnavailable`` saying so, nothing is written, reads go on, and once the replicas
    are back (here: the setting lowered) writes are taken again."""
    with RedisServer() as server:
        app, noop = make_app("noreplicas", f"{server.url}/0", f"{server.url}/0")
        delayq = DelayQ.of(app)
        kept = noop.apply_delayed(args=(0,), delay=60, job_id="kept").job_id
        admin = redis.Redis(port=server.port)
        admin.config_set("min-replicas-to-write", 1)
        writes = {
            "apply_delayed": lambda: noop.apply_delayed(args=(1,), delay=60),
            "own job id": lambda: noop.apply_delayed(args=(1,), delay=60, job_id="j"),
            "apply_delayed_many": lambda: noop.apply_delayed_many(
                [{"args": (n,), "delay": 60} for n in range(20)]),
            "cancel": lambda: delayq.cancel(kept),
            "pause": lambda: delayq.pause(task=noop.name),
        }
        for name, write in writes.items():
            with pytest.raises(StoreUnavailable, match="min-replicas-to-write") as refused:
                write()
            assert "a refused call writes nothing" in str(refused.value), name
        assert [job.job_id for job in delayq.pending()] == [kept]
        admin.config_set("min-replicas-to-write", 0)
        assert delayq.cancel(kept)


def test_a_redis_that_cannot_save_its_snapshot_refuses_writes_as_unavailable(tmp_path):
    """With ``stop-writes-on-bgsave-error`` (Redis's default) and save points, a failed RDB
    snapshot (a full disk; here its directory removed) makes Redis refuse every write
    (``MISCONF``) until a snapshot succeeds: ``StoreUnavailable`` says so, reads go on, and
    writes are taken again once it may (here: its save points removed)."""
    directory = tmp_path / "redis"
    directory.mkdir()
    with RedisServer(directory=str(directory)) as server:
        app, noop = make_app("misconf", f"{server.url}/0", f"{server.url}/0")
        delayq = DelayQ.of(app)
        kept = noop.apply_delayed(args=(0,), delay=60, job_id="kept").job_id
        admin = redis.Redis(port=server.port)
        admin.config_set("save", "3600 1")
        shutil.rmtree(directory)
        admin.bgsave()
        wait_for(lambda: admin.info("persistence")["rdb_last_bgsave_status"] == "err",
                 what="the snapshot failing")
        try:
            for name, write in {"apply_delayed": lambda: noop.apply_delayed(args=(1,), delay=60),
                                "cancel": lambda: delayq.cancel(kept)}.items():
                with pytest.raises(StoreUnavailable, match="RDB snapshot") as refused:
                    write()
                assert "a refused call writes nothing" in str(refused.value), name
            assert [job.job_id for job in delayq.pending()] == [kept]
        finally:
            admin.config_set("save", "")  # and so Redis can stop without a snapshot
        assert delayq.cancel(kept)


def test_a_redis_busy_with_another_clients_script_refuses_calls_as_unavailable(caplog):
    """Another client's script that runs past Redis's busy threshold makes Redis answer
    every other command ``BUSY``: producers get ``StoreUnavailable`` saying so (not a raw
    ``ResponseError``), the carrier pauses its shards, and once the script ends every job
    is promoted."""
    with RedisServer(extra=("--lua-time-limit", "100")) as server:
        app, noop = make_app("busy", f"{server.url}/0", f"{server.url}/0")
        delayq = DelayQ.of(app)
        jobs = {r.job_id for r in noop.apply_delayed_many(
            [{"args": (n,), "delay": 0.5} for n in range(20)], queue=QUEUE)}
        carrier = Carrier(app)
        carrier.run_once()
        # Spins until the test ends it with SCRIPT KILL (at most 60 s): a script of a fixed
        # length ended before the carrier's claim on a loaded machine (redis-py 5.0.1's
        # slower retries of the three calls below).
        spin = ("local s = redis.call('TIME')[1] "
                "while tonumber(redis.call('TIME')[1]) < s + 60 do end return 1")
        other = threading.Thread(target=_killed, args=(redis.Redis(port=server.port), spin))
        other.start()
        wait_for(lambda: _busy(server), timeout=5, what="Redis busy")
        calls = {
            "apply_delayed": lambda: noop.apply_delayed(args=(1,), delay=60, queue=QUEUE),
            "pending": delayq.pending,
            "cancel": lambda: delayq.cancel("j"),
        }
        for name, call in calls.items():
            with pytest.raises(StoreUnavailable, match="busy running a script") as refused:
                call()
            assert "SCRIPT KILL" in str(refused.value), name
        with caplog.at_level(logging.INFO, logger="celery_delayq.carrier"):
            carrier._next_maintenance = float("inf")  # the claim itself meets BUSY
            carrier.run_once()
            assert _busy(server), "the script ended before the carrier's claim: no test"
            redis.Redis(port=server.port).script_kill()
            other.join()

            def drained() -> bool:
                carrier.run_once()
                return settled(delayq)

            wait_for(drained, timeout=10, what="every job promoted")
        carrier.close()
        failing = [r.getMessage() for r in caplog.records if "cannot be served" in r.getMessage()]
        assert failing and all("busy running a script" in m for m in failing), failing
        assert jobs <= set(delivered_ids(redis.Redis(port=server.port)))


def _killed(client: redis.Redis, script: str) -> None:
    """Run ``script``, which only SCRIPT KILL ends."""
    with pytest.raises(redis.ResponseError, match="killed"):
        client.eval(script, 0)


def _busy(server: RedisServer) -> bool:
    try:
        redis.Redis(port=server.port).ping()
    except redis.ResponseError as exc:
        return str(exc).startswith("BUSY")
    return False
