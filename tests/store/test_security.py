"""Secrets stay out of errors and logs; ids cannot reach outside their namespace."""

from __future__ import annotations

import secrets

import pytest
from celery import Celery

from celery_delayq import DelayedTask, DelayQ, StoreUnavailable
from celery_delayq.testing.redis_server import RedisServer, free_port
from tests.conftest import CLUSTER, store_keys


def app_with_store(url: str) -> tuple[Celery, DelayedTask]:
    app = Celery("secure", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.update(delayq_redis_url=url, delayq_redis_retries=1,
                    delayq_redis_socket_timeout=0.5)

    @app.task(base=DelayedTask, name="secure.noop", shared=False)
    def noop():
        return None

    return app, noop


def test_unreachable_store_error_never_shows_the_password():
    password = secrets.token_urlsafe(12)
    _, noop = app_with_store(f"redis://:{password}@127.0.0.1:{free_port()}/0")
    with pytest.raises(StoreUnavailable) as raised:
        noop.apply_delayed(delay=5)
    assert password not in str(raised.value) and ":***@" in str(raised.value)


def test_store_works_with_a_password_protected_redis():
    password = secrets.token_urlsafe(12)
    with RedisServer(extra=("--requirepass", password)) as server:
        app, noop = app_with_store(f"redis://:{password}@127.0.0.1:{server.port}/0")
        result = noop.apply_delayed(delay=60, key="order:1")
        assert DelayQ.of(app).get(result.job_id).key == "order:1"


@pytest.mark.skipif(CLUSTER, reason="counts keys of the single store")
@pytest.mark.parametrize("job_id", ["delayq:{0}:due", "../../etc", "order:1\u2028x", "*"])
def test_job_ids_that_look_like_keys_stay_inside_the_store(proj, redis_client, job_id):
    before = store_keys(proj.delayq)
    proj.record.apply_delayed(args=("x",), delay=60, job_id=job_id, key=job_id)
    assert proj.delayq.get(job_id).job_id == job_id
    assert set(store_keys(proj.delayq)) <= set(before) | {
        k for s in proj.delayq.store.keys
        for k in (s.due, s.jobs, s.bykey, s.journal, s.counts)}
    assert proj.delayq.cancel_key(job_id) == 1
