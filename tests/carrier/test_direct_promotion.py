"""Direct promotion: the claim script pushes the message kombu would publish, exactly once."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timezone

import pytest
from kombu import Queue

from celery_delayq import envelope
from celery_delayq.carrier import Carrier
from celery_delayq.errors import ConfigurationError
from tests.conftest import CLUSTER, journal_events

pytestmark = pytest.mark.skipif(CLUSTER, reason="a cluster store has no direct promotion")

PARKED = "parked.direct"  # no worker consumes it
DUE = datetime(2026, 1, 1, tzinfo=timezone.utc)


def promote_once(app, *, direct: bool) -> Carrier:
    carrier = Carrier(app, direct=direct)
    carrier.run_once()
    carrier.close()  # hands the shards back for the next carrier
    return carrier


def parked(redis_client) -> list[dict]:
    """The messages on the parked queue's list, oldest first."""
    return [json.loads(raw) for raw in reversed(redis_client.lrange(PARKED, 0, -1))]


def comparable(message: dict) -> tuple[dict, tuple[str, str]]:
    """A message as a worker reads it, without what differs per publish; and its reprs."""
    properties = dict(message["properties"])
    properties.pop("delivery_tag")
    body = message["body"]
    if properties.pop("body_encoding", None) == "base64":
        body = base64.b64decode(body).decode()
    headers = dict(message["headers"])
    reprs = headers.pop("argsrepr"), headers.pop("kwargsrepr")
    return {**message, "headers": headers, "properties": properties,
            "body": json.loads(body)}, reprs


@pytest.mark.parametrize(("args", "kwargs", "options"), [
    ((), None, {}),
    ((42, "x", [], {}, 12345678901234567, 0.30000000000000004, "é ☃", None, True), None, {}),
    (("nested",), {"empty": [], "also": {}, "deep": [[{"a": []}]]}, {"key": "order:42"}),
    (("own task id",), None, {"task_id": "t-1", "key": "refund:9"}),
    (("odd ids",), None, {"job_id": '~a"b\\c/d', "task_id": "~~x"}),
    (("uuid ids",), None, {"job_id": "0b7e8f3a-3c1e-4e55-9a1d-8d3b8e1e5f00",
                           "task_id": "0b7e8f3a-3c1e-4e55-9a1d-8d3b8e1e5f00"}),
    (("result ignored",), None, {"ignore_result": True}),  # an app's task_ignore_result
])
def test_direct_message_is_the_message_kombu_publishes(proj, app, redis_client, args, kwargs,
                                                         options):
    messages = []
    for direct in (False, True):
        proj.anything.apply_delayed(args=args, kwargs=kwargs, eta=DUE, queue=PARKED,
                                  **{"job_id": "same", "task_id": "same", **options})
        promote_once(app, direct=direct)
        messages.append(parked(redis_client)[-1])
    (published, (argsrepr, kwargsrepr)), (pushed, reprs) = map(comparable, messages)
    assert "body_encoding" in messages[0]["properties"], "the first went through kombu"
    assert "body_encoding" not in messages[1]["properties"], "the second was pushed directly"
    if "replaced_task_nesting" not in published["headers"]:  # Celery < 5.3.5 sends none;
        assert pushed["headers"].pop("replaced_task_nesting") == 0  # its workers read 0 then
    assert pushed == published
    assert pushed["body"][:2] == [list(args), kwargs or {}]
    # Celery writes Python reprs; the script writes the arguments' JSON text
    assert (argsrepr, kwargsrepr) == (repr(tuple(args)), repr(kwargs or {}))
    assert [json.loads(text) for text in reprs] == [list(args), kwargs or {}]


@pytest.mark.parametrize("due", [
    DUE.replace(microsecond=1000), DUE.replace(microsecond=70_000),
    datetime(2026, 2, 28, 23, 59, 59, 999_000, tzinfo=timezone.utc),
    datetime(2024, 2, 29, 12, 0, 0, 120_000, tzinfo=timezone.utc),
])
def test_direct_message_carries_the_eta_kombu_would_to_the_millisecond(proj, app,
                                                                       redis_client, due):
    etas = []
    for direct in (False, True):
        proj.anything.apply_delayed(eta=due, queue=PARKED, job_id="same")
        promote_once(app, direct=direct)
        etas.append(parked(redis_client)[-1]["headers"]["eta"])
    assert etas[0] == etas[1] == due.isoformat(timespec="milliseconds")


def test_a_planted_fractional_due_score_gives_the_message_kombu_would(
        proj, app, delayq, redis_client):
    """A score such as ``...083.5`` (planted, or written by another client): the header
    and the journal carry whole milliseconds, as through kombu."""
    messages, dues = [], []
    for direct in (False, True):
        proj.anything.apply_delayed(eta=DUE, queue=PARKED, job_id="same", task_id="same")
        shard = delayq.store.keys.shard(delayq.get("same").shard)
        redis_client.zadd(shard.due, {"same": DUE.timestamp() * 1000 + 0.75})
        promote_once(app, direct=direct)
        messages.append(comparable(parked(redis_client)[-1])[0])
        dues.append(delayq.store.client.xrevrange(shard.journal, count=1)[0][1]["due"])
    assert messages[1] == messages[0]
    assert messages[1]["headers"]["delayq_due"] == int(DUE.timestamp() * 1000)
    assert dues == [str(int(DUE.timestamp() * 1000))] * 2


def test_direct_promotion_forgets_each_job_once_and_journals_it(
        proj, app, delayq, redis_client):
    for i in range(300):
        proj.record.apply_delayed(args=(i,), eta=DUE, queue=PARKED, key=f"order:{i % 7}")
    carrier = promote_once(app, direct=True)
    promote_once(app, direct=True)

    assert sorted(m["body"] for m in parked(redis_client)) == sorted(
        f'[[{i}],{{}},{{"callbacks":null,"errbacks":null,"chain":null,"chord":null}}]'
        for i in range(300))
    assert carrier.stats.promoted == 300
    assert delayq.pending(limit=1000) == [] and delayq.pending(key="order:3") == []
    assert sum(s["inflight"] for s in delayq.store.stats()) == 0
    assert delayq.store.counts() == ({}, 0)
    assert journal_events(delayq).count("promoted") == 300


#: Planted envelopes (hand-edited, damaged) a worker could not decode: never pushed, but
#: claimed, so the carrier dead-letters them as it does any job of the kombu path.
_FIRST = json.dumps({"t": "tests.proj.record", "q": PARKED}, separators=(",", ":"))
UNDECODABLE = {
    "unterminated string": f'{_FIRST}\n["a]\n'.encode(),
    "trailing comma": f'{_FIRST}\n[1,]\n'.encode(),
    "no comma": f'{_FIRST}\n[1 2]\n'.encode(),
    "unquoted name": f'{_FIRST}\n[]\n{{a:1}}'.encode(),
    "a fourth line": f'{_FIRST}\n[1]\n{{}}\n{{}}'.encode(),
    "UTF-8 a deletion would join": f'{_FIRST}\n["'.encode() + b"\xe0\xa0\xc2\x80\x80"
                                   + b'"]\n',
    "an empty task name": f'{{"t":"","q":"{PARKED}"}}\n[1]\n'.encode(),
    "a raw tab in a string": f'{_FIRST}\n["a\tb"]\n'.encode(),
    "a leading zero": f'{_FIRST}\n[01]\n'.encode(),
    "a negative leading zero": f'{_FIRST}\n[]\n{{"a":-01}}'.encode(),
    "a raw tab in the task name": f'{{"t":"tests.proj.record\t","q":"{PARKED}"}}\n[1]\n'.encode(),
}


def test_a_planted_envelope_a_worker_could_not_decode_is_dead_lettered_not_pushed(
        proj, app, delayq, redis_client):
    shard = delayq.store.keys.shard(0)
    for name, raw in UNDECODABLE.items():
        redis_client.hset(shard.jobs, name, raw)
        redis_client.zadd(shard.due, {name: 0})
    proj.record.apply_delayed(args=("healthy at 12:05, [01]\\",), eta=DUE, queue=PARKED)

    promote_once(app, direct=True)

    [pushed] = parked(redis_client)
    assert comparable(pushed)[0]["body"][0] == ["healthy at 12:05, [01]\\"]
    assert "body_encoding" not in pushed["properties"], "pushed by the claim script"
    assert sorted(entry["job_id"] for entry in delayq.store.dead()) == sorted(UNDECODABLE)


def test_an_envelope_over_the_payload_limit_is_dead_lettered_as_through_kombu(
        proj, app, delayq, redis_client):
    """Stored before ``delayq_max_payload_bytes`` was lowered, or planted."""
    limit = delayq.config.max_payload_bytes
    shard = delayq.store.keys.shard(0)
    for name, size in (("over", limit + 1), ("at", limit)):
        filler = "x" * (size - len(f'{_FIRST}\n[""]\n'))
        redis_client.hset(shard.jobs, name, f'{_FIRST}\n["{filler}"]\n')
        redis_client.zadd(shard.due, {name: 0})
    proj.record.apply_delayed(args=("healthy",), eta=DUE, queue=PARKED)

    promote_once(app, direct=True)

    pushed = parked(redis_client)
    assert sorted(len(comparable(m)[0]["body"][0][0]) for m in pushed) == [
        len("healthy"), limit - len(f'{_FIRST}\n[""]\n')]
    assert [m["properties"].get("body_encoding") for m in pushed] == [None, None]  # direct
    [dead] = delayq.store.dead()
    assert (dead["job_id"], dead["reason"]) == ("over", "envelope over delayq_max_payload_bytes")


def test_an_empty_business_key_adds_no_key_header_as_kombu_adds_none(
        proj, app, delayq, redis_client):
    shard = delayq.store.keys.shard(0)
    redis_client.hset(shard.jobs, "keyless", f'{{"t":"tests.proj.record","q":"{PARKED}",'
                                             '"y":""}\n[1]\n')
    redis_client.zadd(shard.due, {"keyless": 0})
    promote_once(app, direct=True)
    [message] = parked(redis_client)
    assert "delayq_key" not in message["headers"]


def test_jobs_with_options_still_go_through_kombu(proj, app, redis_client):
    callback = proj.record.si("after")
    proj.record.apply_delayed(args=("plain",), eta=DUE, queue=PARKED)
    proj.record.apply_delayed(args=("expiring",), eta=DUE, queue=PARKED, expires=3600)
    proj.record.apply_delayed(args=("linked",), eta=DUE, queue=PARKED, link=callback)
    proj.record.apply_delayed(args=("tagged",), eta=DUE, queue=PARKED, headers={"tenant": "a"})
    proj.record.apply_delayed(args=("secret",), eta=DUE, queue=PARKED, argsrepr="('***',)")
    # kombu's JSON object for a datetime: the carrier decodes it first (it may be unreadable)
    proj.anything.apply_delayed(args=("dated", DUE), eta=DUE, queue=PARKED)
    promote_once(app, direct=True)

    by_label = {comparable(m)[0]["body"][0][0]: m for m in parked(redis_client)}
    assert by_label.keys() == {"plain", "expiring", "linked", "tagged", "secret", "dated"}
    assert "body_encoding" not in by_label["plain"]["properties"]
    for label in ("expiring", "linked", "tagged", "secret", "dated"):
        assert by_label[label]["properties"]["body_encoding"] == "base64", label
    assert by_label["expiring"]["headers"]["expires"]
    assert by_label["linked"]["body"]
    assert by_label["tagged"]["headers"]["tenant"] == "a"
    # what worker logs and events show: the call's own repr, not the argument
    assert by_label["secret"]["headers"]["argsrepr"] == "('***',)"


def test_long_arguments_get_a_truncated_repr_that_is_still_valid_utf8(
        proj, app, delayq, redis_client):
    shard = delayq.store.keys.shard_for("long")
    text = "é" * 2000  # raw UTF-8: two bytes per character
    raw = envelope.encode({"t": proj.record.name, "q": PARKED, "a": ["x"]}).replace(
        '["x"]', json.dumps([text], ensure_ascii=False))
    redis_client.hset(shard.jobs, "long", raw.encode())
    redis_client.zadd(shard.due, {"long": 0})
    # a queue the app knows when the carrier starts is promoted into directly from its
    # first job (task_create_missing_queues adds it; else that job goes through kombu)
    assert app.amqp.queues[PARKED]
    promote_once(app, direct=True)

    (message,) = parked(redis_client)
    argsrepr = message["headers"]["argsrepr"]
    assert argsrepr.endswith("...") and len(argsrepr.encode()) <= app.amqp.argsrepr_maxsize
    assert json.loads(message["body"])[0] == [text]


def test_direct_promotion_refuses_a_broker_on_another_database(proj, app, redis_client):
    app.conf.broker_url = app.conf.broker_url.rsplit("/", 1)[0] + "/1"
    try:
        proj.record.apply_delayed(args=("x",), eta=DUE, queue=PARKED)
        with pytest.raises(ConfigurationError, match="needs the delay store on the broker's"):
            promote_once(app, direct=True)
    finally:
        app.conf.broker_url = app.conf.broker_url.rsplit("/", 1)[0] + "/0"
    assert proj.delayq.pending()[0].args == ["x"], "nothing was lost"


def test_direct_promotion_refuses_a_failover_list_of_brokers(proj, app, redis_client):
    """kombu may move to the list's next broker at any time; the claim script would still
    push to the store's server, where no worker listens then."""
    store_url = app.conf.broker_url
    app.conf.update(delayq_redis_url=store_url,
                    broker_url=f"{store_url};redis://:secret@127.0.0.1:1/0")
    try:
        proj.record.apply_delayed(args=("x",), eta=DUE, queue=PARKED)
        with pytest.raises(ConfigurationError, match="failover list") as refused:
            promote_once(app, direct=True)
    finally:
        app.conf.update(delayq_redis_url=None, broker_url=store_url)
    assert "secret" not in str(refused.value)
    assert proj.delayq.pending()[0].args == ["x"], "nothing was lost"


def test_a_queue_the_carrier_did_not_know_is_pushed_to_directly_after_its_first_batch(
        proj, app, redis_client):
    late = "parked.late"
    carrier = Carrier(app, direct=True)
    carrier.run_once()  # routes the queues known now
    try:
        for label in ("first", "second"):
            proj.record.apply_delayed(args=(label,), eta=DUE, queue=late)
            carrier.run_once()
    finally:
        carrier.close()
    first, second = (json.loads(raw) for raw in reversed(redis_client.lrange(late, 0, -1)))
    assert first["properties"]["body_encoding"] == "base64", "through kombu, which creates it"
    assert "body_encoding" not in second["properties"], "then pushed by the claim script"
    assert json.loads(second["body"])[0] == ["second"]


def test_a_queue_the_app_declares_under_the_store_keys_stops_no_direct_promotion(
        proj, app, redis_client):
    """``task_queues`` naming a queue whose list would be a key of the store: the carrier
    started routing the app's queues with it and raised UnknownQueue, on every start."""
    app.amqp.queues.add(Queue("delayq:{0}:due"))
    try:
        proj.record.apply_delayed(args=("beside",), eta=DUE, queue="parked.beside")
        promote_once(app, direct=True)
    finally:
        app.amqp.queues.pop("delayq:{0}:due")
    assert redis_client.type("delayq:{0}:due") in ("zset", "none")
    assert json.loads(json.loads(redis_client.lpop("parked.beside"))["body"])[0] == ["beside"]
