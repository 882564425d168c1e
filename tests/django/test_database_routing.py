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
