"""A call's publish options reach the promoted message as ``apply_async`` sends them, on a
Redis broker (kombu's publish batches) and on one without batches (``memory://``, as
RabbitMQ or SQS, or Redis with kombu < 5.7)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from celery import Celery

from celery_delayq import DelayedTask, DelayQ
from celery_delayq.carrier import Carrier
from tests.carrier.test_direct_promotion import PARKED, parked, promote_once

DUE = datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize(("mode", "expected"), [(1, 1), ("transient", 1), (2, 2),
                                                 ("persistent", 2)])
def test_a_calls_delivery_mode_is_the_promoted_messages_as_in_apply_async(
        proj, app, redis_client, mode, expected):
    proj.anything.apply_async(("native",), queue=PARKED, delivery_mode=mode)
    proj.anything.apply_delayed(args=("delayed",), eta=DUE, queue=PARKED, delivery_mode=mode)
    promote_once(app, direct=False)

    native, delayed = parked(redis_client)
    assert native["properties"]["delivery_mode"] == expected
    assert delayed["properties"]["delivery_mode"] == expected


def test_a_broker_without_publish_batches_gets_a_calls_delivery_mode(redis_server,
                                                                      redis_client):
    app = Celery("unbatched", broker="memory://", set_as_current=False)
    # memory:// is one broker per process: a queue and store prefix of its own
    app.conf.update(delayq_redis_url=f"{redis_server.url}/0", delayq_shards=1,
                    delayq_prefix="delayq-unbatched", task_default_queue="unbatched")
    delayq = DelayQ(app)

    @app.task(base=DelayedTask, name="unbatched.task")
    def task(label):
        return label

    task.apply_delayed(args=("plain",), eta=DUE)
    task.apply_delayed(args=("transient",), eta=DUE, delivery_mode=1)
    carrier = Carrier(app)
    try:
        carrier.run_once()
    finally:
        carrier.close()
        delayq.store.close()

    assert carrier.stats.promoted == 2 and delayq.pending() == []
    with app.connection_for_read() as connection:
        queue = connection.SimpleQueue("unbatched")
        messages = [queue.get(timeout=1) for _ in range(2)]
        queue.close()
    modes = {json.loads(m.body)[0][0]: m.properties["delivery_mode"] for m in messages}
    assert modes == {"plain": 2, "transient": 1}
