"""Sentry's Celery integration continues the producer's trace across the delay.

Sentry adds its ``sentry-trace`` and ``baggage`` headers in its wrappers of
``Task.apply_async`` and ``Celery.send_task``; a call parked in the store goes through
neither, so celery-delayq adds them when the call is scheduled. A call without a delay goes
through Sentry's wrapper, whether ``sentry_sdk.init`` ran before ``DelayQ(app)`` or after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.util import find_spec

import pytest
from celery.result import AsyncResult

from tests.compat import worker_and_carrier
from tests.conftest import ROOT, wait_for

pytestmark = pytest.mark.skipif(
    find_spec("sentry_sdk") is None,
    reason="sentry-sdk is not installed (pip install -e '.[dev]' brings it)")

#: A root span (a transaction) of sentry-sdk 2.x or 3.x: 3.x removed ``start_transaction`` and
#: starts one with ``start_span``, which in 2.x starts a span no transaction sends.
START_A_ROOT_SPAN = """
import sentry_sdk
start_root_span = getattr(sentry_sdk, "start_transaction", sentry_sdk.start_span)
"""

PRODUCE_IN_A_ROOT_SPAN = START_A_ROOT_SPAN + """
import json
from tests.compat.sentry_proj import app, plain, record
with start_root_span(name="checkout") as checkout:
    ids = {
        "apply_delayed": record.apply_delayed(args=("apply_delayed",), delay=0.5,
                                              queue="sentried").id,
        "countdown": record.apply_async(("countdown",), countdown=0.5, queue="sentried").id,
        "send_task": app.send_task(record.name, ("send_task",), countdown=0.5,
                                   queue="sentried").id,
        "plain": plain.apply_async(("plain",), countdown=0.5, queue="sentried").id,
        **{label: result.id for label, result in zip(("many 1", "many 2"),
           record.apply_delayed_many([{"args": ("many 1",), "delay": 0.5},
                                      {"args": ("many 2",), "delay": 0.5}],
                                     queue="sentried"))},
    }
sentry_sdk.flush()  # 3.x streams spans from a thread, and the atexit integration is off
print(json.dumps({"trace_id": checkout.trace_id, "ids": ids}))
"""


def test_sentry_continues_the_producers_trace_across_the_delay(proj, redis_client, tmp_path):
    """Producer, carrier and worker are processes of their own, all with Sentry."""
    events = tmp_path / "sentry.jsonl"
    env = dict(os.environ, PYTHONPATH=ROOT, DELAYQ_TEST_SENTRY=str(events))
    with worker_and_carrier("tests.compat.sentry_proj", "sentried", env):
        produced = json.loads(subprocess.run(
            [sys.executable, "-c", PRODUCE_IN_A_ROOT_SPAN],
            cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout)
        ids = produced["ids"]
        for label, task_id in ids.items():
            assert AsyncResult(task_id, app=proj.app).get(timeout=30) == label

        def spans() -> dict[str, dict]:
            return {span["span_id"]: span
                    for span in map(json.loads, events.read_text().splitlines())}

        def runs() -> dict[str, dict]:
            """Each task id's run on the worker: the root span above Sentry's span of the
            task's call (the one with its message id)."""
            recorded = spans()
            return {span["message_id"]: recorded[span["parent_span_id"]]
                    for span in recorded.values()
                    if span["op"] == "queue.process" and span["message_id"]
                    and span["parent_span_id"] in recorded}

        traces = wait_for(lambda: len(runs()) == len(ids) and runs(),
                          what="the worker's root spans")
    recorded = spans().values()
    checkout = next(span for span in recorded if span["name"] == "checkout")
    assert checkout["trace_id"] == produced["trace_id"]
    assert {label: traces[task_id]["trace_id"] for label, task_id in ids.items()} == dict.fromkeys(
        ids, produced["trace_id"])
    # a stored call is a child of the span it was scheduled in; a plain task's countdown keeps
    # the submit span of Sentry's apply_async wrapper (no second set of headers), and the
    # carrier's publish adds none either
    submit = next(span for span in recorded if span["parent_span_id"] == checkout["span_id"]
                  and span["name"] == proj.plain.name)
    assert {label: traces[task_id]["parent_span_id"] for label, task_id in ids.items()} == {
        **dict.fromkeys(ids, checkout["span_id"]), "plain": submit["span_id"]}


SEND_WITHOUT_A_DELAY = START_A_ROOT_SPAN + """
import json
from celery import Celery, signals
from sentry_sdk.integrations.celery import CeleryIntegration
from sentry_sdk.transport import Transport
from celery_delayq import DelayQ

class Nowhere(Transport):
    def capture_envelope(self, envelope):
        pass

apps = {name: Celery(name, broker="memory://", set_as_current=False)
        for name in ("plain", "opted in before init", "opted in after init")}
DelayQ(apps["opted in before init"])  # Django's layout: celery.py, then settings.py's init
sentry_sdk.init(dsn="https://public@sentry.invalid/1", traces_sample_rate=1.0,
                integrations=[CeleryIntegration()], default_integrations=False,
                transport=Nowhere)
DelayQ(apps["opted in after init"])
sent = {}

@signals.before_task_publish.connect
def record(sender=None, headers=None, **_):
    sent[sender] = sorted({"sentry-trace", "baggage"} & set(headers))

with start_root_span(name="view"):
    for name, app in apps.items():
        app.send_task(name)
print(json.dumps(sent))
"""


def test_sentry_adds_its_headers_to_a_call_without_a_delay_whenever_it_was_initialised():
    """Django projects opt in (``proj/celery.py``) before ``settings.py`` inits Sentry."""
    sent = json.loads(subprocess.run([sys.executable, "-c", SEND_WITHOUT_A_DELAY], cwd=ROOT,
                                     check=True, capture_output=True, text=True).stdout)
    assert sent == {app: ["baggage", "sentry-trace"]
                    for app in ("plain", "opted in before init", "opted in after init")}
