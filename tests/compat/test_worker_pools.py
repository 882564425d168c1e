"""A worker of Celery's gevent pool (``-P gevent``, monkey-patched by ``celery`` at start):
delayed tasks run, retry through the store and reach the journal, as with prefork, threads
and solo."""

from __future__ import annotations

import pytest

from celery_delayq.keys import pack_id
from tests.conftest import wait_for


def test_a_gevent_worker_runs_delayed_tasks_retries_them_and_journals_it(
        proj, delayq, carrier, spawn):
    pytest.importorskip("gevent", reason="pip install gevent (in the test extra) to run it")
    worker = spawn("worker", "-Q", "gevent", "-P", "gevent", "-c", "20", "--without-heartbeat",
                   "--without-gossip", "--without-mingle", "-l", "INFO")
    results = [proj.record.apply_delayed((f"gevent {n}",), delay=0.3, queue="gevent")
               for n in range(5)]
    results.append(proj.flaky.apply_delayed(("gevent flaky",), {"failures": 2, "countdown": 0.3},
                                            delay=0.3, queue="gevent"))

    def ran() -> list[str]:
        assert worker.poll() is None, f"the worker exited:\n{worker.log.read_text()[-3000:]}"
        labels = sorted(run["label"] for run in proj.runs() if run["label"].startswith("gevent"))
        return labels if len(labels) >= 8 else []

    try:
        labels = wait_for(ran, timeout=30, what="8 runs on the gevent worker")
    except pytest.fail.Exception:
        print(worker.log.read_text()[-3000:])  # shown with the failure
        raise
    assert labels == sorted(["gevent flaky"] * 3 + [f"gevent {n}" for n in range(5)])
    assert "(gevent)" in worker.log.read_text(), "the worker's banner names its pool"

    ours = {pack_id(result.job_id) for result in results}

    def journaled() -> list[dict[str, str]]:
        events = [fields for shard in delayq.store.keys
                  for _, fields in delayq.store.client.xrange(shard.journal)
                  if fields.get("job") in ours]
        done = {fields["job"] for fields in events if fields["event"] == "succeeded"}
        return events if len(done) == 6 else []

    events = wait_for(journaled, what="the journal's succeeded events")
    assert {fields["event"] for fields in events} == {"scheduled", "promoted", "started",
                                                     "retried", "succeeded"}
    # every run's: a flush that met a gevent race in redis-py's pool ("Invalid file
    # object") dropped its events, which are now kept for the next one (a write redis-py
    # retried may deliver one twice)
    runs = {(fields["job"], fields["retries"]) for fields in events
            if fields["event"] == "started"}
    retries = {(fields["job"], fields["retries"]) for fields in events
               if fields["event"] == "retried"}
    assert (len(runs), len(retries)) == (8, 2)
    assert delayq.pending() == []
