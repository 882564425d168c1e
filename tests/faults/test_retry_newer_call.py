"""A run's retry never replaces a newer call of its job id.

A producer schedules a job id again (``if_exists="keep"``) while that job's earlier run
executes: nothing of it is stored then, so the new call is. The run then retries: its
retry (of the earlier call, under the same job id) used to replace the new call, which
never ran, its result PENDING for ever. The newer call now stays, and the retry's result
is REVOKED (its job went on with the newer call).
"""

from __future__ import annotations

import json

from celery_delayq.carrier import Carrier
from tests.conftest import finish, prefork_worker, wait_for

QUEUE = "retry-newer-call"


def test_a_runs_retry_leaves_a_newer_call_of_its_job_id_in_place(
        proj, delayq, redis_client, spawn):
    worker = prefork_worker(proj, spawn, QUEUE)
    earlier = proj.slow_flaky.apply_delayed(("earlier",), {"seconds": 2.0}, delay=0,
                                            job_id="order:7:close", queue=QUEUE)
    carrier = Carrier(proj.app)
    try:
        wait_for(lambda: carrier.run_once() >= 0 and any(
            json.loads(run)["label"] == "earlier"
            for run in redis_client.lrange("test:runs", 0, -1)), what="the earlier run")
    finally:
        carrier.close()
    newer = proj.slow_flaky.apply_delayed(("newer",), delay=600, job_id="order:7:close",
                                          queue=QUEUE)
    assert newer.id != earlier.id

    wait_for(lambda: earlier.state == "REVOKED", timeout=20, what="the earlier call REVOKED")
    job = delayq.get("order:7:close")
    assert (job.args, job.task_id) == (["newer"], newer.id)
    worker.terminate()
    log = finish(worker)
    assert "its job id order:7:close holds a newer call" in log, log[-3000:]
