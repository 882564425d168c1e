"""A project whose router keeps the delayq app's models in a database of their own: the
mirror is written there, each sync batch in one transaction of that database."""

from __future__ import annotations

import pytest
from django.db import connections

from celery_delayq.contrib.django.models import DelayedTask, JournalCursor

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "mirror"])


class MirrorRouter:
    """The delayq app's models in the ``mirror`` database, everything else in ``default``."""

    def db_for_read(self, model, **hints):
        return "mirror" if model._meta.app_label == "delayq" else None

    db_for_write = db_for_read


def test_sync_writes_each_batch_in_one_transaction_of_the_routed_database(
        settings, shop_delayq, sync):
    settings.DATABASE_ROUTERS = [MirrorRouter()]
    for n in range(3):
        shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(n,), delay=600,
                             job_id=f"order:{n}:close")
    outside: list[str] = []

    def in_a_transaction(execute, sql, params, many, context):
        if sql.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")) and not \
                context["connection"].in_atomic_block:
            outside.append(sql[:80])
        return execute(sql, params, many, context)

    sync.run_once()  # the cursors are made (each in a transaction of its own)
    shop_delayq.cancel("order:0:close")
    with connections["mirror"].execute_wrapper(in_a_transaction):
        assert sync.run_once() == 1  # the cancel
    DelayedTask.objects.filter(job_id="order:1:close").delete()  # a row backfill makes again
    with connections["mirror"].execute_wrapper(in_a_transaction):
        assert sync.backfill() == 1
    assert outside == []
    assert DelayedTask.objects.using("mirror").filter(state="scheduled").count() == 2
    assert not DelayedTask.objects.using("default").exists()
    assert not JournalCursor.objects.using("default").exists()


class LaggingReplicaRouter:
    """Reads from ``mirror``, a replica that lags for good (writes go to ``default``), as
    the primary/replica router of Django's multiple-databases guide routes them."""

    def db_for_read(self, model, **hints):
        return "mirror"

    def db_for_write(self, model, **hints):
        return "default"


def test_a_cancel_of_a_row_a_lagging_replica_shows_unwritten_ends(settings, shop_delayq):
    """The replica says "not in Redis yet", the primary says written, and Redis holds no
    such job (it ran): the cancel asked again after reading the row from the replica again,
    until RecursionError (an admin 500 after ~1,000 Redis calls)."""
    from celery_delayq.contrib.django import operations

    fields = {"pk": 4242, "job_id": "order:1:close", "task": "shop.tasks.close_unpaid_order",
              "state": "scheduled"}  # (a replica's row has its primary's pk)
    DelayedTask.objects.using("mirror").create(**fields, stored=False)
    DelayedTask.objects.using("default").create(**fields, stored=True)
    settings.DATABASE_ROUTERS = [LaggingReplicaRouter()]
    row = DelayedTask.objects.get(job_id="order:1:close")
    assert row.stored is False  # read from the replica

    assert operations.cancel(row, by="admin") == (False, operations._GONE)


def test_reconcile_pushes_the_call_the_primary_holds_not_a_lagging_replicas(
        settings, shop_delayq):
    """The row was replaced (a new call) before the replica caught up: the push read the
    replica's older call."""
    from celery_delayq import envelope
    from celery_delayq.contrib.django.reconcile import reconcile

    fields = {"pk": 4242, "job_id": "order:1:close", "task": "shop.tasks.close_unpaid_order",
              "state": "scheduled", "stored": False}
    for database, n in (("mirror", 1), ("default", 2)):
        DelayedTask.objects.using(database).create(
            **fields, envelope=envelope.encode({"t": fields["task"], "a": [n], "k": {}}))
    settings.DATABASE_ROUTERS = [LaggingReplicaRouter()]

    assert reconcile(shop_delayq).pushed == ["order:1:close"]

    assert shop_delayq.get("order:1:close").args == [2]


def test_the_sync_reads_the_rows_it_updates_from_the_database_written_to(
        settings, shop_delayq, sync):
    """A row the lagging replica did not have yet was made again: the batch failed on the
    job id's unique constraint, and the shard stopped being mirrored."""
    shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(1,), delay=600,
                         job_id="order:1:close")
    sync.run_once()  # the row, in the one database there is for now
    settings.DATABASE_ROUTERS = [LaggingReplicaRouter()]  # the replica has no row yet
    shop_delayq.cancel("order:1:close")

    assert sync.run_once() == 1

    row = DelayedTask.objects.using("default").get(job_id="order:1:close")
    assert row.state == "cancelled"
    assert sync.backfill() == 0  # nothing pending: read where it is written, not re-made
