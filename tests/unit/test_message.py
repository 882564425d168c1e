"""Promotion rebuilds the message apply_async would have sent, its eta the due time."""

from __future__ import annotations

import pytest
from kombu.utils.json import loads

from celery_delayq.decoding import decode
from celery_delayq.envelope import ORIGIN
from celery_delayq.errors import PayloadError
from celery_delayq.message import MessageBuilder, eta_header

from .calls import UNUSABLE_ENVELOPES, build


def promote(app, call, builder=None, *, shard=0, due_ms=0):
    builder = builder or MessageBuilder(app)
    return builder.build(call.job_id, call.envelope, shard=shard, due_ms=due_ms)


def test_message_is_celery_protocol_2_with_the_due_time_as_eta(app):
    call = build(app, kwargs={"reason": "unpaid"}, priority=5, headers={"tenant": "acme"},
                 expires=3600, job_id="order:42:close")
    msg = promote(app, call, shard=3, due_ms=1000)
    args, kwargs, embed = loads(msg.body)
    assert (args, kwargs) == ([42], {"reason": "unpaid"})
    assert embed == {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    assert msg.headers["id"] == msg.headers["root_id"] == call.task_id != call.job_id
    assert msg.properties["correlation_id"] == call.task_id
    assert msg.headers["task"] == msg.task == "unit.plain"
    assert msg.headers["eta"] == "1970-01-01T00:00:01.000+00:00"  # request.eta: due time
    assert msg.headers["expires"] and 3590 < msg.properties["expiration"] <= 3600
    assert msg.headers["tenant"] == "acme"
    assert (msg.headers["delayq_job"], msg.headers["delayq_shard"],
            msg.headers["delayq_due"]) == ("order:42:close", 3, 1000)
    assert msg.properties["priority"] == 5
    assert (msg.queue, msg.exchange, msg.routing_key) == ("celery", "", "celery")


def test_default_queue_comes_back_and_routing_is_kept(app):
    assert promote(app, build(app)).routing_key == "celery"
    msg = promote(app, build(app, queue="topical"))
    assert (msg.queue, msg.exchange, msg.routing_key) == ("topical", "events", "shop.#")


def test_link_callbacks_survive_the_round_trip(app):
    callback = app.signature("unit.after", args=(1,))
    msg = promote(app, build(app, link=callback))
    assert loads(msg.body)[2]["callbacks"][0]["task"] == "unit.after"


@pytest.mark.parametrize("options", [
    {},
    {"key": "order:7"},
    {"job_id": "refund:9:check", "key": "refund:9"},
    {"task_id": "fixed-task-id", "headers": {"tenant": "acme"}},
    {"queue": "topical", "priority": 3, "time_limit": 30, "soft_time_limit": 20},
    {"root_id": "root-1", "parent_id": "parent-1", "retries": 2, "shadow": "shown-as"},
])
def test_every_job_of_a_shared_shape_gets_celerys_own_message(app, options):
    """Built once per first line, the message still equals create_task_message's for
    each job: its own ids, key and arguments, nothing of another job's."""
    builder = MessageBuilder(app)
    for n in range(3):
        call = build(app, args=(n, "x" * n), kwargs={"n": n} if n else None, **dict(options))
        env = decode(call.envelope)
        msg = promote(app, call, builder, shard=n, due_ms=n)
        o = {"origin": ORIGIN, "ignore_result": None, **env.get("o", {})}  # null: the task's
        _, properties, body, _ = app.amqp.create_task_message(
            env.get("i", call.job_id), env["t"], env["a"], env["k"], **o)
        headers = app.amqp.create_task_message(  # of args given as a tuple, as callers do
            env.get("i", call.job_id), env["t"], tuple(env["a"]), env["k"], **o)[0]
        headers.update(env.get("h", {}), delayq_job=call.job_id, delayq_shard=n, delayq_due=n,
                       eta=eta_header(n))
        if "y" in env:
            headers["delayq_key"] = env["y"]
        assert msg.headers == headers
        assert msg.properties == {**properties, **env.get("p", {})}
        assert loads(msg.body) == list(body)
        assert msg.key == env.get("y")


def test_jobs_that_differ_only_by_key_or_task_id_share_one_shape(app):
    builder = MessageBuilder(app)
    for n in range(50):
        promote(app, build(app, key=f"order:{n}", task_id=f"task-{n}"), builder)
    promote(app, build(app), builder)
    assert len(builder._shapes) == 1


def test_short_arguments_get_the_repr_a_native_call_gets(app):
    """Celery's callers pass args as a tuple (``delay(*args)``), JSON keeps a list."""
    native = app.amqp.create_task_message("t", "unit.plain", (1, "x"), {"k": 2})[0]
    headers = promote(app, build(app, args=(1, "x"), kwargs={"k": 2})).headers
    assert (headers["argsrepr"], headers["kwargsrepr"]) == (native["argsrepr"],
                                                            native["kwargsrepr"])


def test_long_arguments_get_celerys_shortened_repr(app):
    call = build(app, args=(["y" * 40] * 60,))
    args = tuple(decode(call.envelope)["a"])
    shortened = app.amqp.create_task_message("t", "unit.plain", args, {})[0]["argsrepr"]
    assert promote(app, call).headers["argsrepr"] == shortened
    assert len(shortened) < len(repr(args))


def test_a_calls_own_argsrepr_and_kwargsrepr_are_what_logs_and_events_show(app):
    """Celery's way to keep secrets out of worker logs and monitoring events (Flower,
    ``task-received``): the representations a call gives are its message's, as
    ``apply_async`` sends them; the arguments themselves are unchanged."""
    call = build(app, args=("4111-1111",), kwargs={"cvv": "123"}, argsrepr="('****',)",
                 kwargsrepr="{'cvv': '***'}")
    msg = promote(app, call)
    assert (msg.headers["argsrepr"], msg.headers["kwargsrepr"]) == ("('****',)",
                                                                   "{'cvv': '***'}")
    assert loads(msg.body)[:2] == [["4111-1111"], {"cvv": "123"}]
    assert "argsrepr" not in msg.properties
    only_args = promote(app, build(app, args=("4111-1111",), argsrepr="('****',)"))
    assert (only_args.headers["argsrepr"], only_args.headers["kwargsrepr"]) == (
        "('****',)", "{}")


@pytest.mark.parametrize("option", ["argsrepr", "kwargsrepr"])
def test_an_argsrepr_that_is_no_text_is_refused_at_the_call(app, option):
    with pytest.raises(PayloadError, match=f"{option} must be a string"):
        build(app, **{option: {"cvv": "***"}})


@pytest.mark.parametrize("raw", [
    *UNUSABLE_ENVELOPES, '{"t": "x", "o": {"expires": "soon"}}', '{"t": "x", "o": 5}\n[]\n',
])
def test_unusable_envelopes_are_refused_not_published(app, raw):
    with pytest.raises(PayloadError):
        MessageBuilder(app).build("j", raw, shard=0, due_ms=0)
