"""What a ``before_task_publish`` handler or a call's own headers change in a stored call's
message is what the carrier publishes, as Celery publishes what the handler was given.

The jobs go to the queue ``parked``, which no worker consumes; an in-process carrier
publishes them (through kombu, and by direct promotion when the job qualifies) and the
messages are read back from the broker's lists as a worker would get them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator

import pytest
from celery import signals

from celery_delayq.errors import InvalidOption
from tests.conftest import PROMOTIONS
from tests.faults.test_carrier_faults import PARKED, carry_until_quiet

MASK = "<hidden>"


def delivered(client) -> list[dict]:
    """Every message on the queue ``parked``'s lists (one per priority), decoded."""
    return [json.loads(raw) for name in client.scan_iter(f"{PARKED}*")
            for raw in client.lrange(name, 0, -1)]


def body_of(message: dict) -> list:
    """A message's body decoded, as kombu's Redis transport reads it."""
    body = message["body"]
    if message["properties"].get("body_encoding") == "base64":
        body = base64.b64decode(body)
    return json.loads(body)


@pytest.fixture
def handler() -> Iterator[Callable[[Callable], None]]:
    """Connect a ``before_task_publish`` handler for one test."""
    connected: list[Callable] = []

    def connect(function: Callable) -> None:
        signals.before_task_publish.connect(function, weak=False)
        connected.append(function)

    yield connect
    for function in connected:
        signals.before_task_publish.disconnect(function)


@pytest.mark.parametrize("promotion", PROMOTIONS)
def test_arguments_and_priority_a_publish_handler_changes_are_published(
        proj, delayq, redis_client, handler, promotion):
    def add_tenant(body=None, properties=None, **_):
        body[0].append("added")
        body[1]["tenant"] = "acme"
        properties["priority"] = 9

    handler(add_tenant)
    result = proj.record.apply_delayed(("order-1",), {}, delay=0, queue=PARKED)
    stored = delayq.get(result.job_id)
    assert (stored.args, stored.kwargs) == (["order-1", "added"], {"tenant": "acme"})

    carry_until_quiet(proj.app, direct=promotion == "direct")
    [message] = delivered(redis_client)
    args, kwargs, _ = body_of(message)
    assert (args, kwargs) == (["order-1", "added"], {"tenant": "acme"})
    assert message["properties"]["priority"] == 9
    assert message["headers"]["argsrepr"] == "('order-1', 'added')"


@pytest.mark.parametrize("promotion", PROMOTIONS)
def test_what_a_publish_handler_removes_or_sets_in_place_of_celerys_is_published(
        proj, delayq, redis_client, handler, promotion):
    def edit(body=None, headers=None, properties=None, **_):
        headers.pop("tenant")
        headers["delayq_key"] = "forged"  # the store's own header: set per message
        properties.pop("priority")
        properties["expiration"] = 60
        body[0][0] = 1  # in place of True: equal, not the same JSON
        body[2]["errbacks"] = [{"task": "tests.proj.record", "args": ["failed"],
                                "kwargs": {}, "options": {}, "subtask_type": None,
                                "immutable": False}]

    handler(edit)
    proj.record.apply_delayed((True,), delay=0, queue=PARKED, priority=5,
                              headers={"tenant": "t1"})
    carry_until_quiet(proj.app, direct=promotion == "direct")
    [message] = delivered(redis_client)
    args, _, embed = body_of(message)
    assert args == [1] and args[0] is not True
    assert "tenant" not in message["headers"] and "delayq_key" not in message["headers"]
    assert (message["properties"]["priority"], message["properties"]["expiration"]) == (
        0, "60000")
    assert [errback["args"] for errback in embed["errbacks"]] == [["failed"]]


def test_arguments_a_publish_handler_makes_unstorable_are_refused_at_the_call(
        proj, delayq, redis_client, handler):
    def add_nan(body=None, **_):
        body[1]["ratio"] = float("nan")

    handler(add_nan)
    with pytest.raises(Exception, match="not JSON"):
        proj.record.apply_delayed(("order-1",), delay=0, queue=PARKED)
    assert delayq.pending() == []


@pytest.mark.parametrize("promotion", PROMOTIONS)
def test_argsrepr_given_as_headers_hides_the_arguments(proj, delayq, redis_client, promotion):
    proj.record.apply_delayed(("s3cret",), delay=0, queue=PARKED,
                              headers={"argsrepr": MASK, "kwargsrepr": MASK})
    carry_until_quiet(proj.app, direct=promotion == "direct")
    [message] = delivered(redis_client)
    assert (message["headers"]["argsrepr"], message["headers"]["kwargsrepr"]) == (MASK, MASK)


@pytest.mark.parametrize("promotion", PROMOTIONS)
def test_argsrepr_a_publish_handler_masks_stays_masked(proj, delayq, redis_client, handler,
                                                       promotion):
    def mask(headers=None, **_):
        headers["argsrepr"] = MASK

    handler(mask)
    proj.record.apply_delayed(("s3cret",), delay=0, queue=PARKED)
    carry_until_quiet(proj.app, direct=promotion == "direct")
    [message] = delivered(redis_client)
    assert message["headers"]["argsrepr"] == MASK
    assert "s3cret" not in json.dumps(message["headers"])


@pytest.mark.parametrize(("option", "value", "said"), [
    ("expiration", "abc", "expiration must be"),
    ("expiration", float("inf"), "expiration must be"),
    ("expiration", True, "expiration must be"),
    ("expiration", 10**400, "expiration must be"),
    ("delivery_info", "x", "delivery_info must be"),
])
def test_a_message_property_kombu_cannot_publish_is_refused_at_the_call(
        proj, delayq, redis_client, option, value, said):
    with pytest.raises(InvalidOption, match=said):
        proj.record.apply_delayed((1,), delay=0, queue=PARKED, **{option: value})
    assert delayq.pending() == []


def test_a_numeric_expiration_is_published_as_natively(proj, delayq, redis_client):
    proj.record.apply_delayed((1,), delay=0, queue=PARKED, expiration=30)
    carry_until_quiet(proj.app, direct=False)
    [message] = delivered(redis_client)
    assert message["properties"]["expiration"] == "30000"
