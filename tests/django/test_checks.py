"""The Django deployment checks warn when the store's Redis may evict keys (delayq.W001) or
keeps no append-only file (delayq.W004); the plain checks (run by every manage.py command
and a worker's start) do not ask Redis."""

from __future__ import annotations

import pytest
from django.core import checks


@pytest.fixture
def durable(shop_redis):
    """The shop's Redis with AOF on for the test (the test servers run without)."""
    shop_redis.config_set("appendonly", "yes")
    yield
    shop_redis.config_set("appendonly", "no")


def test_the_system_check_warns_when_redis_may_evict_stored_jobs(shop_delayq, shop_redis,
                                                                 durable):
    assert checks.run_checks(tags=["delayq"], include_deployment_checks=True) == []
    assert checks.run_checks(tags=["delayq"]) == []
    shop_redis.config_set("maxmemory-policy", "allkeys-lru")
    try:
        found = checks.run_checks(tags=["delayq"], include_deployment_checks=True)
    finally:
        shop_redis.config_set("maxmemory-policy", "noeviction")
    assert [message.id for message in found] == ["delayq.W001"]
    assert "allkeys-lru" in found[0].msg


def test_the_deployment_check_warns_when_redis_keeps_no_append_only_file(shop_delayq,
                                                                        shop_redis):
    found = checks.run_checks(tags=["delayq"], include_deployment_checks=True)
    assert [message.id for message in found] == ["delayq.W004"]
    assert "appendonly no" in found[0].msg and "appendonly yes" in found[0].hint
    assert checks.run_checks(tags=["delayq"]) == []  # not without --deploy: no round trip


def test_the_deployment_check_warns_when_the_store_url_holds_a_password(shop_app):
    conf = shop_app.conf  # set as the shop_app fixture sets it, under the CELERY namespace
    before = conf.get("delayq_redis_url")
    conf.update(CELERY_DELAYQ_REDIS_URL="redis://:hunter2@127.0.0.1:1/0")
    try:
        found = checks.run_checks(tags=["delayq"], include_deployment_checks=True)
    finally:
        conf.update(CELERY_DELAYQ_REDIS_URL=before)
    (shown,) = [message for message in found if message.id == "delayq.W003"]
    assert "hunter2" not in " ".join(f"{m.msg} {m.hint}" for m in found)
    assert "CELERY_DELAYQ_REDIS_PASSWORD" in shown.hint


@pytest.mark.parametrize(("path", "wrong"), [
    ("demo_project.celry:app", "No module named 'demo_project.celry'"),
    ("demo_project.settings:app", "has no attribute 'app'"),
    ("demo_project.settings:SECRET_KEY", "is a str, not a Celery app"),
], ids=["module-misspelt", "no-such-attribute", "not-an-app"])
def test_a_wrong_celery_app_setting_is_named_with_what_is_wrong(settings, path, wrong):
    """Every manage.py command reads it at start (the app's ready()): a bare traceback there
    never named the setting."""
    from django.core.exceptions import ImproperlyConfigured

    from celery_delayq.contrib.django.runtime import celery_app

    settings.DELAYQ_CELERY_APP = path
    with pytest.raises(ImproperlyConfigured, match=rf"DELAYQ_CELERY_APP = {path!r}.*{wrong}"):
        celery_app()
