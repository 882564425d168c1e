"""DelayedResult builds AsyncResult's state itself (without its promise until needed)."""

from __future__ import annotations

import copy
import pickle
from datetime import datetime, timezone

from celery import Celery
from celery.result import AsyncResult

from celery_delayq import DelayQ
from celery_delayq.result import DelayedResult


def test_delayed_result_has_every_attribute_async_result_sets():
    app = Celery("result-test", set_as_current=False)
    plain = AsyncResult("t-1", app=app)
    delayed = DelayedResult("t-1", "job-1", None, DelayQ(app), key="order:1")
    assert set(vars(plain)) - set(vars(delayed)) == {"on_ready"}  # a cached property here
    assert delayed.on_ready is delayed.on_ready
    assert (delayed.id, delayed.backend, delayed.app, delayed.ignored) == (
        plain.id, plain.backend, plain.app, plain.ignored)


def test_delayed_result_callbacks_run_when_the_result_is_ready():
    app = Celery("result-test", set_as_current=False)
    delayed = DelayedResult("t-2", "job-2", None, DelayQ(app))
    seen = []
    delayed.then(seen.append)
    delayed.on_ready(delayed)
    assert seen == [delayed]


def test_a_pickled_or_copied_delayed_result_keeps_its_job():
    app = Celery("result-test", set_as_current=False)
    eta = datetime(2030, 1, 1, tzinfo=timezone.utc)
    delayed = DelayedResult("t-3", "job-3", eta, DelayQ(app), key="order:3")
    for again in (pickle.loads(pickle.dumps(delayed)), copy.copy(delayed)):
        assert isinstance(again, DelayedResult)
        assert (again.id, again.job_id, again.eta, again.key) == ("t-3", "job-3", eta, "order:3")
