"""The stored envelope is compact and rebuilds the message apply_async would send."""

from __future__ import annotations

import pytest
from celery import Celery
from kombu import Exchange, Queue

from celery_delayq import envelope
from celery_delayq.errors import PayloadError
from celery_delayq.keys import Keyspace


@pytest.fixture
def app():
    app = Celery("unit", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.task_routes = {"unit.routed": {"queue": "refunds"}}
    app.conf.task_queues = [
        Queue("celery"),
        Queue("refunds"),
        Queue("topical", Exchange("events", type="topic"), routing_key="shop.#"),
    ]
    return app


def build(app, name="unit.plain", args=(42,), kwargs=None, **options):
    return envelope.build(app, name, args, kwargs, options, job_id=options.pop("job_id", None),
                          key=options.pop("key", None), max_payload_bytes=4096)


def test_small_call_is_stored_compactly(app):
    call = build(app, key="order:42")
    assert call.envelope == '{"t":"unit.plain","y":"order:42"}\n[42]\n'
    assert envelope.decode(call.envelope) == {"t": "unit.plain", "a": [42], "k": {},
                                              "y": "order:42"}
    assert call.job_id == call.task_id


def test_the_default_queue_is_not_stored_and_comes_back_at_promotion(app):
    env = envelope.decode(build(app).envelope)
    assert "q" not in env
    assert envelope.to_message(app, "j", env, shard=0, due_ms=0).routing_key == "celery"
    assert envelope.decode(build(app, queue="refunds").envelope)["q"] == "refunds"


def test_routing_is_resolved_at_schedule_time(app):
    assert envelope.decode(build(app, "unit.routed").envelope)["q"] == "refunds"
    env = envelope.decode(build(app, queue="topical").envelope)
    assert (env["q"], env["x"], env["r"]) == ("topical", "events", "shop.#")


def test_message_rebuilt_at_promotion_is_celery_protocol_2_without_eta(app):
    call = build(app, kwargs={"reason": "unpaid"}, priority=5, headers={"tenant": "acme"},
                 expires=3600, job_id="order:42:close")
    env = envelope.decode(call.envelope)
    msg = envelope.to_message(app, call.job_id, env, shard=3, due_ms=1000)
    args, kwargs, embed = msg.body
    assert (args, kwargs) == ([42], {"reason": "unpaid"})
    assert embed == {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    assert msg.headers["id"] == call.task_id != call.job_id
    assert msg.headers["task"] == "unit.plain" and msg.headers["eta"] is None
    assert msg.headers["expires"] and 3590 < msg.properties["expiration"] <= 3600
    assert msg.headers["tenant"] == "acme" and msg.headers["delayq_job"] == "order:42:close"
    assert msg.properties["priority"] == 5
    assert (msg.exchange, msg.routing_key) == ("", "celery")


def test_link_callbacks_survive_the_round_trip(app):
    callback = app.signature("unit.after", args=(1,))
    env = envelope.decode(build(app, link=callback).envelope)
    msg = envelope.to_message(app, "j", env, shard=0, due_ms=0)
    assert msg.body[2]["callbacks"][0]["task"] == "unit.after"


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    ((object(),), None, "not JSON-serialisable"),
    ((), {"when": {1, 2}}, "not JSON-serialisable"),
    ("not-a-list", None, "must be a list or tuple"),
    ((), ["not", "a", "mapping"], "must be a mapping"),
    (("x" * 5000,), None, "over delayq_max_payload_bytes=4096"),
])
def test_bad_arguments_are_refused(app, args, kwargs, message):
    with pytest.raises(PayloadError, match=message):
        build(app, args=args, kwargs=kwargs)


def test_pickle_serializer_is_refused(app):
    with pytest.raises(PayloadError, match="JSON only"):
        build(app, serializer="pickle")


@pytest.mark.parametrize("raw", [
    None, "{not json", "[]", '{"t": ""}', '{"t": "x", "a": [1]}', '{"t": "x"}\n1\n',
    '{"t": "x"}\n[]\n[]', '{"t": "x"}\n[1]\n{"k": 1', '{"t": "x", "p": {"content_type": "pickle"}}',
])
def test_unusable_envelopes_are_reported_not_published(raw):
    with pytest.raises(PayloadError):
        envelope.decode(raw)


def test_keys_of_one_shard_share_one_cluster_slot():
    from redis.crc import key_slot

    for shard in Keyspace("delayq", 16):
        keys = [shard.due, shard.inflight, shard.jobs, shard.bykey, shard.dead, shard.journal]
        assert len({key_slot(k.encode()) for k in keys}) == 1
    slots = {key_slot(s.due.encode()) for s in Keyspace("delayq", 16)}
    assert len(slots) == 16


def test_unknown_queue_is_refused_at_the_call_when_queues_are_not_created(app):
    from celery_delayq.errors import UnknownQueue

    app.conf.task_create_missing_queues = False
    with pytest.raises(UnknownQueue, match=r"unknown queue: .*nowhere"):
        build(app, queue="nowhere")
