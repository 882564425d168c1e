"""The stored envelope is compact and keeps what apply_async resolved at call time."""

from __future__ import annotations

import pytest

from celery_delayq import decoding
from celery_delayq.errors import InvalidOption, PayloadError
from celery_delayq.keys import Keyspace

from .calls import UNUSABLE_ENVELOPES, build


def test_small_call_is_stored_compactly(app):
    call = build(app, key="order:42")
    assert call.envelope == '{"t":"unit.plain","y":"order:42"}\n[42]\n'
    assert decoding.decode(call.envelope) == {"t": "unit.plain", "a": [42], "k": {},
                                              "y": "order:42"}
    assert call.job_id == call.task_id


def test_the_default_queue_is_not_stored(app):
    assert "q" not in decoding.decode(build(app).envelope)
    assert decoding.decode(build(app, queue="refunds").envelope)["q"] == "refunds"


def test_routing_is_resolved_at_schedule_time(app):
    assert decoding.decode(build(app, "unit.routed").envelope)["q"] == "refunds"
    env = decoding.decode(build(app, queue="topical").envelope)
    assert (env["q"], env["x"], env["r"]) == ("topical", "events", "shop.#")


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


@pytest.mark.parametrize("raw", UNUSABLE_ENVELOPES)
def test_unusable_envelopes_are_reported_not_published(raw):
    with pytest.raises(PayloadError):
        decoding.decode(raw)


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


@pytest.mark.parametrize(("name", "options", "message"), [
    ("", {}, "task name must be a non-empty string"),
    (None, {}, "task name must be a non-empty string"),
    ("reports.daily\x1b]0;owned\x07", {}, r"task name .* U\+001B"),
    ("reports.\x9b31m", {}, r"task name .* U\+009B"),
    ("reports.\u202egnp", {}, r"task name .* U\+202E"),
    ("unit.plain", {"queue": "tenant-acme\r\nforged"}, r"queue .* U\+000D"),
    ("unit.plain", {"queue": "tenant\u2028x"}, r"queue .* U\+2028"),
    ("unit.plain", {"exchange": "events\x85", "routing_key": "shop.x"}, r"exchange .* U\+0085"),
    ("unit.plain", {"queue": "topical", "routing_key": "shop.\u2066"}, r"routing_key .* U\+2066"),
])
def test_task_and_route_names_a_terminal_would_show_raw_are_refused(app, name, options,
                                                                      message):
    with pytest.raises(InvalidOption, match=message):
        build(app, name, **options)


def test_a_router_building_the_queue_from_arguments_is_checked_too(app):
    app.conf.task_routes = [lambda name, args, kwargs, options, task=None, **_: {
        "queue": f"tenant-{args[0]}"}]
    assert decoding.decode(build(app, args=("acme",)).envelope)["q"] == "tenant-acme"
    with pytest.raises(InvalidOption, match=r"queue 'tenant-acme\\x1b\[2J'"):
        build(app, args=("acme\x1b[2J",))


def test_ignore_result_is_stored_only_where_it_is_not_the_tasks_own(app):
    """A message then carries null: the worker takes its task's own (Celery 5.7), as Celery
    before 5.7 always does. An app with task_ignore_result stores nothing more per job."""
    @app.task(name="unit.quiet", ignore_result=True, shared=False)
    def quiet():
        pass

    app.finalize()
    options = {name: decoding.decode(build(app, name, **call).envelope).get("o") for name, call
               in (("unit.quiet", {"ignore_result": True}), ("unit.quiet", {}),
                   ("unit.elsewhere", {"ignore_result": None}),
                   ("unit.elsewhere", {"ignore_result": False}))}
    assert options == {"unit.quiet": None, "unit.elsewhere": None}
    assert decoding.decode(build(app, "unit.quiet", ignore_result=False).envelope)["o"] == {
        "ignore_result": False}
    assert decoding.decode(build(app, "unit.elsewhere", ignore_result=True).envelope)["o"] == {
        "ignore_result": True}


def _celerys_route(app, name, options):
    """(exchange, routing key) Celery's own publisher sends a call of ``name`` to (kombu's
    ``Producer`` publishes a routing key of None as "")."""
    from unittest import mock

    producer = mock.Mock()
    message = app.amqp.create_task_message("id", name, [], {})
    routed = app.amqp.router.route(dict(options), name, (), {})
    app.amqp.send_task_message(producer, name, message, **routed)
    sent = producer.publish.call_args.kwargs
    return sent["exchange"], sent["routing_key"] or ""


@pytest.mark.parametrize("options", [
    {"queue": "fanned", "exchange": "fan"},  # a fanout exchange, no routing key
    {"queue": "fanned"},
    {"queue": "topical", "exchange": "events"},  # a topic exchange, no routing key
], ids=["fanout routed", "fanout queue", "topic routed"])
def test_a_route_without_a_routing_key_is_published_where_celery_publishes_it(app, options):
    from kombu import Exchange, Queue

    from celery_delayq.message import MessageBuilder

    app.conf.task_queues = [*app.conf.task_queues,
                            Queue("fanned", Exchange("fan", type="fanout"))]
    call = build(app, **options)
    message = MessageBuilder(app).build(call.job_id, call.envelope, shard=0, due_ms=0)
    assert (message.exchange, message.routing_key) == _celerys_route(app, "unit.plain", options)


@pytest.mark.parametrize("route", [{"queue": "bcast", "exchange": "bcast"}, {"queue": "bcast"}],
                         ids=["Celery's recipe", "queue only"])
def test_a_call_routed_to_a_broadcast_queue_is_refused_at_the_call(app, route):
    """A Broadcast queue's name is unique to each process: the carrier would declare one of
    its own, bound to the exchange, that no worker consumes."""
    from kombu.common import Broadcast

    app.conf.task_queues = [*app.conf.task_queues, Broadcast("bcast")]
    app.conf.task_routes = {"unit.plain": route}
    with pytest.raises(InvalidOption, match=r"Broadcast queue 'bcast'.*Celery.send_task"):
        build(app)
