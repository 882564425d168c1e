"""Bad input is refused at the call with a clear error, and nothing reaches Redis."""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from uuid import UUID

import pytest
from celery import Celery
from celery._state import _task_stack

from celery_delayq.conf import DelayQConfig
from celery_delayq.errors import (
    ConfigurationError,
    DelayQError,
    InvalidDelay,
    InvalidJobId,
    InvalidOption,
    PayloadError,
)
from tests.conftest import store_keys

NOW = datetime.now(timezone.utc)


def nested(depth: int) -> list:
    """A list nested ``depth`` levels deep (the outermost counts)."""
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


CASES = [
    ({"delay": -5}, InvalidDelay, ">= 0"),
    ({}, InvalidDelay, "exactly one"),
    ({"delay": 5, "eta": NOW}, InvalidDelay, "exactly one"),
    # apply_async's name for a delay: refused, not stored and dropped (or added on top)
    ({"countdown": 60}, InvalidDelay, "countdown=60 is apply_async's; pass delay=60"),
    ({"delay": 5, "countdown": 60}, InvalidDelay, "countdown=60 is apply_async's"),
    ({"eta": datetime(2030, 1, 1)}, InvalidDelay, "no timezone"),
    ({"delay": 10 ** 9}, InvalidDelay, "delayq_max_delay"),
    # its UTC time is before year 1: no due time the store (or a message's eta) can hold
    ({"eta": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))}, InvalidDelay,
     "before year 1"),
    ({"delay": 10 ** 400}, InvalidDelay, "finite"),
    ({"delay": 1, "args": (object(),)}, PayloadError, "not JSON-serialisable"),
    ({"delay": 1, "kwargs": {"blob": "x" * 300_000}}, PayloadError, "delayq_max_payload_bytes"),
    ({"delay": 1, "job_id": ""}, InvalidJobId, "must not be empty"),
    ({"delay": 1, "job_id": "j" * 201}, InvalidJobId, "delayq_max_id_length"),
    ({"delay": 1, "key": "order\x00:1"}, InvalidJobId, "control characters"),
    # a jobs field that name would be an envelope kept for a copy in flight (keys.KEPT)
    ({"delay": 1, "job_id": "\x01order:1"}, InvalidJobId, "control characters"),
    ({"delay": 1, "if_exists": "overwrite"}, InvalidOption, "keep, replace, error"),
    ({"delay": 1, "serializer": "pickle"}, PayloadError, "JSON only"),
    ({"delay": 1, "delivery_mode": "fast"}, InvalidOption, "delivery_mode must be"),
    ({"delay": 1, "delivery_mode": True}, InvalidOption, "delivery_mode must be"),
    # what a carrier could not read back is refused here, not dead-lettered later
    ({"delay": 1, "args": (nested(65),)}, PayloadError, "delayq_max_nesting=64"),
    ({"delay": 1, "args": (nested(985),)}, PayloadError,
     "nested (too deeply|more than delayq_max_nesting)"),  # json on 3.13 encodes 985 levels
    ({"delay": 1, "kwargs": {"deep": {"a": nested(70)}}}, PayloadError, "delayq_max_nesting"),
    ({"delay": 1, "args": (float("nan"),)}, PayloadError, "finite numbers"),
    ({"delay": 1, "kwargs": {"n": float("-inf")}}, PayloadError, "finite numbers"),
    ({"delay": 1, "args": ("half \ud800 a pair",)}, PayloadError, "lone surrogate"),
    ({"delay": 1, "kwargs": {"\udcff": 1}}, PayloadError, "lone surrogate"),
    ({"delay": 1, "args": ("\ude00\ud83d",)}, PayloadError, "lone surrogate"),
    ({"delay": 1, "expires": 10 ** 12}, PayloadError, "expires"),
    ({"delay": 1, "expires": "next tuesday"}, PayloadError, "expires"),
    # what kombu's JSON turns back into a datetime, UUID, Decimal ... but cannot from these
    ({"delay": 1, "args": ({"__type__": "datetime", "__value__": 5},)}, PayloadError,
     "__type__"),
    ({"delay": 1, "kwargs": {"d": {"__type__": "decimal", "__value__": "one"}}}, PayloadError,
     "__type__"),
    ({"delay": 1, "args": ([{"__type__": "no such type", "__value__": 1}],)}, PayloadError,
     "__type__"),
    ({"delay": 1, "headers": {"h": {"__type__": "bytes", "__value__": 5}}}, PayloadError,
     "__type__"),
    ({"delay": 1, "job_id": "id-\udc80"}, InvalidJobId, "not text"),
    ({"delay": 1, "key": "\ud800"}, InvalidJobId, "not text"),
    # what `delayq ls` would print raw: C1 controls, line separators, bidi controls
    ({"delay": 1, "key": "order:\x9b2J\x9b31mred"}, InvalidJobId, r"U\+009B"),
    ({"delay": 1, "key": "order:1\u2028FORGED LINE"}, InvalidJobId, r"U\+2028"),
    ({"delay": 1, "job_id": "order:\u202egnp.exe"}, InvalidJobId, r"U\+202E"),
    ({"delay": 1, "task_id": "order:1\x85NEL"}, InvalidJobId, r"U\+0085"),
    ({"delay": 1, "queue": "tenant-acme\r\n2031-01-01  forged.task"}, InvalidOption,
     r"U\+000D"),
]


@pytest.mark.parametrize(("call", "error", "message"), CASES,
                         ids=[c[2].replace(" ", "-") for c in CASES])
def test_bad_call_is_refused_and_nothing_is_written(proj, redis_client, call, error, message):
    call = dict(call)
    args = call.pop("args", ("x",))
    with pytest.raises(error, match=message) as raised:
        proj.record.apply_delayed(args=args, **call)
    assert isinstance(raised.value, DelayQError)
    assert [k for k in store_keys(proj.delayq) if k != "delayq:meta"] == []


#: what a damaged message of a running delayed task may carry in the carrier's headers
CARRIED = [({"delayq_job": "\x01order:1"}, "control char"),
           ({"delayq_job": 42}, "must be a string"),
           ({"delayq_job": "order:1", "delayq_key": "order:\u2066"}, r"U\+2066")]


@pytest.mark.parametrize(("headers", "message"), CARRIED, ids=[m for _, m in CARRIED])
def test_a_retry_carrying_a_job_no_call_may_have_is_refused(proj, redis_client, headers,
                                                            message):
    """A retry goes on with the job and key of its message's headers (the carrier's): read
    from a damaged message, they are checked as given ones are."""
    task = proj.record
    task.push_request(id="t-1", called_directly=False, **headers)
    _task_stack.push(task)  # as the worker runs it: app.current_worker_task
    try:
        with pytest.raises(InvalidJobId, match=message):
            task.apply_delayed(args=("x",), delay=1, task_id="t-1", headers=headers)
    finally:
        _task_stack.pop()
        task.pop_request()
    assert [k for k in store_keys(proj.delayq) if k != "delayq:meta"] == []


def test_the_carriers_headers_given_to_another_call_are_left_out(proj, delayq, redis_client):
    """Outside the running job's own retry, they name no job of that call's."""
    result = proj.record.apply_delayed(args=("x",), delay=60, headers={
        "delayq_job": "\x01order:1", "delayq_key": "order:\u2066", "trace": "abc"})
    [job] = delayq.pending()
    assert (job.job_id, job.key, result.id) == (result.id, None, result.id)
    assert job.options["h"] == {"trace": "abc"}


def test_one_bad_item_refuses_the_whole_batch(proj, redis_client):
    items = [{"args": (i,), "delay": 5} for i in range(10)] + [{"args": (1,), "delay": -1}]
    with pytest.raises(InvalidDelay):
        proj.record.apply_delayed_many(items)
    assert [k for k in store_keys(proj.delayq) if k != "delayq:meta"] == []


def test_unknown_item_field_is_refused(proj):
    with pytest.raises(InvalidOption, match="countdown"):
        proj.record.apply_delayed_many([{"args": (1,), "countdown": 5}])


@pytest.mark.parametrize("item", [((1,), {}), ("args", "delay"), "args", 5, None, [("args", (1,))]],
                         ids=["a tuple of args and kwargs", "a tuple of field names", "a string",
                              "a number", "None", "a list of pairs"])
def test_an_item_that_is_not_a_mapping_is_refused_by_position(proj, redis_client, item):
    items = [{"args": (0,), "delay": 5}, item]
    with pytest.raises(InvalidOption, match=r"item 1 is a \w+, not a mapping"):
        proj.record.apply_delayed_many(items)
    with pytest.raises(InvalidOption, match=r"item 1 is a \w+, not a mapping"):
        proj.delayq.schedule_many(proj.record.name, items)
    assert [k for k in store_keys(proj.delayq) if k != "delayq:meta"] == []


@pytest.mark.parametrize("items", [None, 5, {"args": (1,), "delay": 5}, "args"],
                         ids=["None", "a number", "one mapping", "a string"])
def test_items_that_are_not_a_collection_of_calls_are_refused(proj, redis_client, items):
    for call in (proj.record.apply_delayed_many,
                 lambda items: proj.delayq.schedule_many(proj.record.name, items)):
        with pytest.raises(InvalidOption, match="must be a list of mappings, one per call"):
            call(items)
    assert [k for k in store_keys(proj.delayq) if k != "delayq:meta"] == []


def test_a_shadowed_tasks_item_that_is_not_a_mapping_is_refused_by_position(redis_server):
    """Its items are given their shadow names before the batch is validated."""
    from celery_delayq import DelayedTask, DelayQ

    app = Celery("shadowed", broker=f"{redis_server.url}/0", set_as_current=False)
    app.conf.delayq_prefix = "shadowed"

    @app.task(base=DelayedTask, name="shadowed.named",
              shadow_name=lambda task, args, kwargs, options: f"named:{args}")
    def named(x):
        return x

    with pytest.raises(InvalidOption, match=r"item 1 is a tuple, not a mapping"):
        named.apply_delayed_many([{"args": (0,), "delay": 5}, ((1,), {})])
    assert [k for k in store_keys(DelayQ.of(app)) if k != "shadowed:meta"] == []


def test_negative_countdown_runs_now_as_in_celery(proj, delayq):
    # Celery treats countdown <= 0 as "no delay": the store is not involved.
    result = proj.record.apply_async(("x",), countdown=-timedelta(seconds=1).total_seconds())
    assert delayq.get(result.id) is None


@pytest.mark.parametrize("args", [
    (nested(63),),  # with the args list itself: 64 levels, the limit
    ("emoji \U0001f600 make surrogate pairs in JSON",),
    ("a backslash then ud800: \\ud800",),
    ([1e308, -1e308, 0.1],),
    ([datetime(2030, 1, 1, tzinfo=timezone.utc), Decimal("1.5"), UUID(int=7),
      {"__type__": "only a look-alike"}],),
], ids=["nesting-at-the-limit", "surrogate-pair", "escaped-backslash", "large-floats",
        "kombu-json-types"])
def test_data_a_carrier_can_read_is_accepted_as_it_was_given(proj, delayq, redis_client, args):
    result = proj.record.apply_delayed(args=args, delay=60)
    assert delayq.get(result.job_id).args == list(args)


def test_max_delay_past_a_hundred_years_is_refused_when_configured():
    app = Celery("bad-input", broker="redis://localhost", set_as_current=False)
    app.conf.delayq_max_delay = 1e12  # due times past year 9999: no reader could show them
    with pytest.raises(ConfigurationError, match=r"at most .* \(100 years\)"):
        DelayQConfig.from_app(app)


SCHEDULES = {
    "apply_delayed": lambda task, args, kwargs: task.apply_delayed(args, kwargs, delay=60),
    "apply_async countdown": lambda task, args, kwargs: task.apply_async(args, kwargs,
                                                                         countdown=3600),
    "apply_delayed_many": lambda task, args, kwargs: task.apply_delayed_many(
        [{"args": args, "kwargs": kwargs, "delay": 60}]),
}


@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=SCHEDULES.keys())
@pytest.mark.parametrize(("args", "kwargs"), [(("x", 2), {}), ((), {"lable": "x"}), ((), {})],
                         ids=["one-too-many", "misspelt-keyword", "missing"])
def test_arguments_the_task_cannot_take_are_refused_as_apply_async_refuses_them(
        proj, redis_client, schedule, args, kwargs):
    with pytest.raises(TypeError) as native:
        proj.record.apply_async(args, kwargs)  # Celery's own check (task typing=True)
    with pytest.raises(TypeError) as delayed:
        schedule(proj.record, args, kwargs)
    assert str(delayed.value) == str(native.value)
    assert [k for k in store_keys(proj.delayq) if k != "delayq:meta"] == []


def test_a_task_with_typing_off_takes_any_arguments_as_in_celery(redis_server):
    from celery_delayq import DelayedTask, DelayQ

    app = Celery("untyped", broker=f"{redis_server.url}/0", set_as_current=False)
    app.conf.delayq_prefix = "untyped"

    @app.task(base=DelayedTask, typing=False, name="untyped.takes_one")
    def takes_one(label):
        return label

    result = takes_one.apply_delayed(("x", "y"), delay=60)
    assert DelayQ.of(app).cancel(result.job_id) is True


def test_an_app_on_celerys_message_protocol_1_is_refused_at_the_call_and_the_carrier(
        redis_server, redis_client):
    """Its calls were stored, then dead-lettered by the carrier (protocol 2 messages only)."""
    from celery_delayq import DelayedTask, DelayQ
    from celery_delayq.carrier import Carrier

    app = Celery("protocol-1", broker=f"{redis_server.url}/0", set_as_current=False)
    app.conf.task_protocol = 1

    @app.task(base=DelayedTask, name="protocol_1.add")
    def add(x, y):
        return x + y

    delayq = DelayQ(app)
    for schedule in SCHEDULES.values():
        with pytest.raises(ConfigurationError, match="task_protocol=1"):
            schedule(add, (1, 2), {})
    assert [k for k in store_keys(delayq) if k != "delayq:meta"] == []
    with pytest.raises(ConfigurationError, match="task_protocol=1"):
        Carrier(app)


def test_iso_times_ending_in_z_are_utc_as_with_an_offset(proj, delayq):
    """JSON APIs and JavaScript write "…Z", which Python 3.10's fromisoformat refuses."""
    due = (datetime.now(timezone.utc) + timedelta(hours=2)).replace(microsecond=0)
    expires = due + timedelta(hours=1)
    result = proj.record.apply_async(("x",), eta=due.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                     expires=expires.strftime("%Y-%m-%dT%H:%M:%S.000Z"))
    job = delayq.get(result.id)
    assert job.due == due
    assert datetime.fromisoformat(job.options["o"]["expires"]) == expires


@pytest.mark.parametrize(("eta", "message"), [
    (date(2030, 1, 1), "eta must be a datetime or ISO-8601 text, got date"),
    (1_900_000_000, "eta must be a datetime or ISO-8601 text, got int"),
    ("2030-01-02T24:00:00Z", "eta '2030-01-02T24:00:00Z' is not an ISO-8601 time"),
], ids=["date", "int", "hour-24"])
def test_an_apply_async_eta_no_time_can_be_read_from_is_refused_clearly(proj, redis_client,
                                                                      eta, message):
    """Celery's own path fails on these deep inside (a date's missing tzinfo) or later."""
    with pytest.raises(InvalidDelay, match=message):
        proj.record.apply_async(("x",), eta=eta)
    assert [k for k in store_keys(proj.delayq) if k != "delayq:meta"] == []


def test_a_call_due_before_1970_answers_its_due_time(proj, delayq):
    """Years 1-9999 are due times; one before 1970 is a negative number of ms."""
    eta = datetime(1969, 12, 31, 23, 59, 59, tzinfo=timezone.utc)
    assert proj.record.apply_delayed(("x",), eta=eta).eta == eta
    kept = proj.record.apply_delayed(("x",), eta=eta, job_id="early", if_exists="keep")
    assert proj.record.apply_delayed(("y",), delay=5, job_id="early",
                                     if_exists="keep").eta == kept.eta == eta


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda d: d.cancel(123), InvalidJobId, "job_id must be a string, got int"),
    (lambda d: d.cancel("x", key=5), InvalidJobId, "key must be a string, got int"),
    (lambda d: d.get(None), InvalidJobId, "job_id must be a string, got NoneType"),
    (lambda d: d.get(b"x"), InvalidJobId, "job_id must be a string, got bytes"),
    (lambda d: d.reschedule(7, delay=5), InvalidJobId, "job_id must be a string"),
    (lambda d: d.run_now(["x"]), InvalidJobId, "job_id must be a string"),
    (lambda d: d.pending(limit=1.5), InvalidOption, "limit must be a whole number"),
    (lambda d: d.pending(limit=-1), InvalidOption, "limit must be a whole number"),
    (lambda d: d.pending(limit=True), InvalidOption, "limit must be a whole number"),
    (lambda d: d.pending(task=123), InvalidOption, "task must be a task name"),
    (lambda d: d.pending(key=5), InvalidJobId, "key must be a string"),
], ids=["cancel-id", "cancel-key", "get-none", "get-bytes", "reschedule", "run-now",
        "limit-float", "limit-negative", "limit-bool", "task-int", "pending-key"])
def test_a_lookup_of_something_no_job_can_have_is_refused_clearly(delayq, call, error,
                                                                    message):
    with pytest.raises(error, match=message):
        call(delayq)


BAD_TASK = "reports.daily\x1b]0;owned\x07\x1b[1;31mALL JOBS CANCELLED"
BAD_QUEUE = "tenant-acme\r\n2031-01-01T00:00:00.000+00:00  forged.task  queue=x"
IN_AN_HOUR = NOW + timedelta(hours=1)
#: Every way a producer reaches the store, with the task name and options of the call.
PRODUCERS = {
    "apply_delayed": lambda proj, name, **o: proj.record.apply_delayed(("x",), delay=60, **o),
    "apply_delayed_many": lambda proj, name, **o: proj.record.apply_delayed_many(
        [{"args": ("x",), "delay": 60}], **o),
    "apply_async countdown": lambda proj, name, **o: proj.record.apply_async(
        ("x",), countdown=3600, **o),
    "DelayQ.schedule": lambda proj, name, **o: proj.delayq.schedule(name, ("x",), delay=60,
                                                                    **o),
    "DelayQ.schedule_many": lambda proj, name, **o: proj.delayq.schedule_many(
        name, [{"args": ("x",), "delay": 60}], **o),
    "send_task countdown": lambda proj, name, **o: proj.app.send_task(
        name, ("x",), countdown=3600, **o),
    "send_task eta": lambda proj, name, **o: proj.app.send_task(name, ("x",),
                                                                eta=IN_AN_HOUR, **o),
}
NAMED = [name for name in PRODUCERS if name.startswith(("DelayQ", "send_task"))]


@pytest.mark.parametrize("producer", PRODUCERS)
@pytest.mark.parametrize(("options", "message"), [
    ({"queue": BAD_QUEUE}, "queue .* U\\+000D"),
    ({"queue": "tenant-\x9b31m"}, "queue .* U\\+009B"),
    ({"exchange": "events\u202e", "routing_key": "x"}, "exchange .* U\\+202E"),
], ids=["queue-crlf", "queue-c1", "exchange-bidi"])
def test_a_route_name_a_terminal_would_show_raw_is_refused_on_every_producer_path(
        proj, redis_client, producer, options, message):
    with pytest.raises(InvalidOption, match=message):
        PRODUCERS[producer](proj, proj.record.name, **options)
    assert [k for k in store_keys(proj.delayq) if k != "delayq:meta"] == []


@pytest.mark.parametrize("producer", PRODUCERS)
@pytest.mark.parametrize(("options", "message"), [
    ({"queue": 5}, "queue must be a queue name .* got int"),
    ({"queue": b"orders"}, "queue must be a queue name .* got bytes"),
    ({"exchange": object(), "routing_key": "x"}, "exchange must be an exchange name .* got object"),
    ({"exchange": "events", "routing_key": 5}, "routing_key must be a string, got int"),
], ids=["queue-int", "queue-bytes", "exchange-object", "routing-key-int"])
def test_a_route_that_is_not_a_name_is_refused_before_celerys_router_keeps_it(
        proj, redis_client, producer, options, message):
    """Celery's router would add a queue named 5 to the app's queues; the carrier then
    dead-lettered the job ("envelope fields have the wrong type")."""
    with pytest.raises(InvalidOption, match=message):
        PRODUCERS[producer](proj, proj.record.name, **options)
    assert [k for k in store_keys(proj.delayq) if k != "delayq:meta"] == []
    assert all(isinstance(name, str) for name in proj.app.amqp.queues)


@pytest.mark.parametrize("producer", NAMED)
@pytest.mark.parametrize(("name", "message"), [
    ("", "task name must be a non-empty string"),
    (BAD_TASK, "task name .* U\\+001B"),
    ("reports.\x9b2J", "task name .* U\\+009B"),
    ("reports.daily\u2028forged", "task name .* U\\+2028"),
], ids=["empty", "escape", "c1", "line-separator"])
def test_a_task_name_that_is_empty_or_a_terminal_would_show_raw_is_refused(
        proj, redis_client, producer, name, message):
    with pytest.raises(InvalidOption, match=message):
        PRODUCERS[producer](proj, name)
    assert [k for k in store_keys(proj.delayq) if k != "delayq:meta"] == []


def test_an_empty_task_name_never_counts_as_a_cancel(proj, delayq, redis_client):
    """The counts field "" is the cancels total: a job of task "" was counted there."""
    with pytest.raises(InvalidOption):
        delayq.schedule("", ("x",), delay=600)
    delayq.cancel(delayq.schedule(proj.record.name, ("x",), delay=600).job_id)
    assert delayq.store.counts() == ({}, 1)


def plant(delayq, job_id: str, key: str, task: str) -> None:
    """A pending job written with raw Redis commands, as an older version stored it."""
    client, shard = delayq.store.client, delayq.store.keys.shard_for(job_id, key)
    client.hset(shard.jobs, job_id, json.dumps({"t": task, "y": key}) + "\n[1]\n")
    client.zadd(shard.due, {job_id: delayq.store.now_ms() + 600_000})
    client.zadd(shard.bykey, {f"{key}\x00{job_id}": 0})


def test_a_job_stored_with_characters_now_refused_is_still_found_and_cancelled(
        proj, delayq, redis_client):
    """Ids and keys are checked on writes only: jobs older versions stored stay reachable."""
    job_id, key = "order:\u202e1", "order:\x9b1"
    plant(delayq, job_id, key, proj.record.name)
    assert delayq.get(job_id, key=key).key == key
    assert [job.job_id for job in delayq.pending(key=key)] == [job_id]
    assert delayq.cancel(job_id, key=key) is True


def test_the_jobs_of_a_key_stored_with_characters_now_refused_are_cancelled_by_key(
        proj, delayq, redis_client):
    for job_id in ("old:1", "old:2"):
        plant(delayq, job_id, "order:\u20281", proj.record.name)
    assert delayq.cancel_key("order:\u20281") == 2
    with pytest.raises(InvalidJobId, match="key must be a non-empty string"):
        delayq.cancel_key("")
