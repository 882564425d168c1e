"""Reservations: a producer scheduling an id of its own holds it on the id's own shard
until its write is done (celery_delayq/reservation.py)."""

from __future__ import annotations

import time

import pytest

from celery_delayq.errors import JobExists
from tests.conftest import store_keys
from tests.store.test_one_id_one_job import keys_on_two_shards


def reservations(delayq) -> list[str]:
    return [key for key in store_keys(delayq) if ":reserved:" in key]


@pytest.mark.parametrize("if_exists", ["keep", "replace", "error"])
def test_no_reservation_outlives_the_call(proj, delayq, if_exists):
    first_key, second_key = keys_on_two_shards(delayq)
    proj.record.apply_delayed(args=(1,), delay=60, job_id="close-42", key=first_key)
    try:
        proj.record.apply_delayed(args=(2,), delay=60, job_id="close-42", key=second_key,
                                  if_exists=if_exists)
    except JobExists:
        assert if_exists == "error"
    proj.record.apply_delayed_many([{"args": (n,), "delay": 60, "job_id": f"b{n}"}
                                    for n in range(50)])
    assert reservations(delayq) == []


def test_a_producer_waits_for_the_reservation_another_holds(proj, delayq):
    """A producer that died holding a reservation delays the next one until it expires;
    the next one then schedules (here a planted reservation of 400 ms)."""
    store = delayq.store
    store.client.set(store.keys.reservation("close-42", "close-42"), "someone", px=400)
    start = time.monotonic()
    proj.record.apply_delayed(args=(1,), delay=60, job_id="close-42", key="order:1")
    assert time.monotonic() - start >= 0.35
    assert [job.job_id for job in delayq.pending()] == ["close-42"]
    assert reservations(delayq) == []

