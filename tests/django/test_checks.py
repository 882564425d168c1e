"""The Django deployment check warns (delayq.W001) when the store's Redis may evict keys;
the plain checks (run by every manage.py command and a worker's start) do not ask Redis."""

from __future__ import annotations

from django.core import checks


def test_the_system_check_warns_when_redis_may_evict_stored_jobs(shop_delayq, shop_redis):
    assert checks.run_checks(tags=["delayq"], include_deployment_checks=True) == []
    assert checks.run_checks(tags=["delayq"]) == []
    shop_redis.config_set("maxmemory-policy", "allkeys-lru")
    try:
        found = checks.run_checks(tags=["delayq"], include_deployment_checks=True)
    finally:
        shop_redis.config_set("maxmemory-policy", "noeviction")
    assert [message.id for message in found] == ["delayq.W001"]
    assert "allkeys-lru" in found[0].msg
