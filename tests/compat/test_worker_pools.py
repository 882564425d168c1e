"""A worker of Celery's gevent pool (``-P gevent``, monkey-patched by ``celery`` at start):
delayed tasks run, retry through the store and reach the journal, as with prefork, threads
and solo."""

from __future__ import annotations

import pytest

from tests.conftest import wait_for, wait_for_events


def test_a_gevent_worker_runs_delayed_tasks_retries_them_and_journals_it(
        proj, delayq, carrier, spawn):
    pytest.importorskip("gevent", reason="pip install gevent (in the test extra) to run it")
    pool = queue = "gevent"
    worker = spawn("worker", "-Q", queue, "-P", pool, "-c", "20", "--without-heartbeat",
                   "--without-gossip", "--without-mingle", "-l", "INFO")
    for n in range(5):
        proj.record.apply_delayed((f"record {n}",), delay=0.3, queue=queue)
    proj.flaky.apply_delayed(("flaky",), {"failures": 2, "countdown": 0.3}, delay=0.3,
                             queue=queue)

    def ran() -> list[str]:
        assert worker.poll() is None, f"the worker exited:\n{worker.log.read_text()[-3000:]}"
        labels = sorted(run["label"] for run in proj.runs())
        return labels if len(labels) == 8 else []

    try:
        labels = wait_for(ran, timeout=30, what=f"8 runs on the {pool} worker")
    except pytest.fail.Exception:
        print(worker.log.read_text()[-3000:])  # shown with the failure
        raise
    assert labels == ["flaky"] * 3 + [f"record {n}" for n in range(5)]
    assert "(gevent)" in worker.log.read_text(), "the worker's banner names its pool"
    events = wait_for_events(delayq, started=8, succeeded=6, retried=2)
    assert events.count("scheduled") == 8 and "failed" not in events
    assert delayq.pending() == []
