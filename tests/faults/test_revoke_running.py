"""A task revoked while it runs, whose run then retries: natively the retry's message
reaches a worker that keeps the revoke in memory and discards it; here the retry waits in
the store, where a worker started later (a deploy) never heard the revoke. The revoke is
recorded in the store, and the retry the run stores after it is cancelled there."""

from __future__ import annotations

import json
import socket

from tests.conftest import answers, finish, wait_for

QUEUE = "revoke-running"


def test_the_retry_a_revoked_run_stores_is_cancelled_and_its_result_is_revoked(
        proj, delayq, redis_client, spawn):
    name = "revoke-running"
    worker = spawn("worker", "-Q", QUEUE, "-n", f"{name}@%h", "-P", "prefork", "-c", "1",
                   "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "INFO")
    wait_for(lambda: answers(proj.app, f"{name}@{socket.gethostname()}"), timeout=30,
             what=f"worker {name}")
    result = proj.slow_flaky.apply_async(("revoked",), {"seconds": 1.5}, queue=QUEUE)
    wait_for(lambda: any(json.loads(run)["label"] == "revoked"
                         for run in redis_client.lrange("test:runs", 0, -1)),
             what="the run")

    result.revoke()  # nothing stored yet: the run goes on, and retries

    wait_for(lambda: result.state == "REVOKED", timeout=20, what="the result REVOKED")
    assert delayq.get(result.id) is None and delayq.pending() == []
    worker.terminate()
    log = finish(worker)
    assert "was revoked while it ran: its retry is cancelled" in log, log[-3000:]
