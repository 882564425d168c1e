"""Read-only commands write nothing: ``delayq stats``, ``ls`` and ``health`` (and the
``Store`` reads behind them) on an empty store leave Redis as it was, and run as a Redis
user that may only read."""

from __future__ import annotations

import pytest

from celery_delayq.store import Store
from tests.conftest import CLUSTER, finish

READER, PASSWORD = "delayq-reader", "reader-test-password"
#: Every read command and what a client's connection needs; no write.
READER_RULES = ["on", f">{PASSWORD}", "~*", "&*", "-@all", "+@read", "+@connection",
                "+time", "+info"]


def empty_store(delayq) -> None:
    """Delete every key of the store, its record (``meta``) too."""
    client = delayq.store.client
    for key in client.scan_iter(f"{delayq.store.keys.prefix}*"):
        client.delete(key)


def test_stats_and_listings_of_an_empty_store_write_nothing(proj, delayq):
    """A process whose first calls are reads (a fresh ``Store``) writes no key, its
    record neither."""
    empty_store(delayq)
    store = Store(delayq.config)

    assert sum(row["pending"] for row in store.stats()) == 0
    assert store.pending() == [] and store.pending(task=proj.record.name) == []
    assert store.pending(key="order:1") == [] and store.dead() == []
    store.close()
    assert list(delayq.store.client.scan_iter(f"{delayq.store.keys.prefix}*")) == []


def test_a_read_only_store_then_written_records_itself(proj, delayq):
    """The same process writing later records the store as a first writer does."""
    empty_store(delayq)
    store = Store(delayq.config)
    store.stats()
    assert not delayq.store.client.exists(store.keys.meta)

    store.pause("task:x", "test")
    store.close()

    assert delayq.store.client.hget(store.keys.meta, "shards") == str(store.keys.shards)


@pytest.mark.skipif(CLUSTER, reason="one Redis with an ACL user")
@pytest.mark.parametrize("command", [("stats",), ("stats", "--json"), ("ls",),
                                     ("ls", "--task", "tests.proj.record"), ("health",)])
def test_stats_ls_and_health_of_an_empty_store_run_as_a_user_that_may_only_read(
        spawn, redis_server, redis_client, monkeypatch, command):
    redis_client.execute_command("ACL", "SETUSER", READER, "reset", *READER_RULES)
    try:
        host_port = redis_server.url.removeprefix("redis://")
        monkeypatch.setenv("DELAYQ_TEST_STORE_URL", f"redis://{READER}:{PASSWORD}@{host_port}/0")
        process = spawn("delayq", *command)
        output = finish(process)
    finally:
        redis_client.acl_deluser(READER)

    assert process.returncode == 0, output
    assert redis_client.keys("delayq*") == []
