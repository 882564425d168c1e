"""What Celery's publisher does at call time, done when a call is scheduled.

``apply_async(countdown=...)`` sends ``before_task_publish`` and ``after_task_publish`` when
it is called, and a ``task-sent`` event with ``task_send_sent_event``. A call parked in the
store does the same when it is scheduled: the signals get the message the carrier will
publish (headers with ``eta`` the due time, body, exchange, routing key), and the headers
their handlers add or change (a tracing context: OpenTelemetry, Datadog...) are stored with
the call and delivered with its message, so a trace continues across the delay.

Sentry's Celery integration adds its trace headers in wrappers of ``Task.apply_async`` and
``Celery.send_task``, not in a signal, and a stored call goes through neither; so when
``sentry_sdk`` is imported and traces Celery calls, the headers that wrapper would add are
added here too (:func:`add_sentry_trace`), before the signals fire, as natively.

The carrier publishes with kombu directly, not through ``app.send_task``: nothing fires a
second time at promotion, so a tracer sees one publish (at call time) and the worker's run
as its child, as with native countdown. Without handlers, events and Sentry nothing here
runs.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery import signals
from kombu.utils.json import loads

from .decoding import decode_fields
from .envelope import DELAYQ_HEADERS, REPRS, Call, as_published, encode_json
from .message import Message, MessageBuilder
from .validation import Due

if TYPE_CHECKING:
    from .extension import DelayQ


@dataclass(frozen=True)
class Sent:
    """A scheduled call as the publish signals saw it, for ``after_task_publish``."""

    message: Message
    body: tuple


class Publishing:
    """Publish signals and ``task-sent`` events of one app's scheduled calls."""

    def __init__(self, delayq: DelayQ) -> None:
        self.app = delayq.app
        self._keys = delayq.store.keys
        self._max_payload = delayq.config.max_payload_bytes
        self._max_nesting = delayq.config.max_nesting
        self._messages = MessageBuilder(self.app)
        self._events = self.app.events.Dispatcher(enabled=False)  # as Celery's publisher

    def wanted(self) -> bool:
        """True when a signal handler, ``task_send_sent_event`` or Sentry wants to hear of
        calls."""
        return bool(signals.before_task_publish.receivers
                    or signals.after_task_publish.receivers
                    or self.app.conf.task_send_sent_event
                    or _sentry_celery() is not None)

    def before(self, call: Call, due: Due) -> tuple[Call, Sent]:
        """Send ``before_task_publish``; ``call`` as its handlers left the message (what
        they add, change or remove is stored with it, but what the carrier sets per
        message: ids, ``eta``, ``delayq_*`` headers)."""
        due_ms = round(due.absolute_ms(time.time() * 1000))
        message = self._messages.build(call.job_id, call.envelope, due_ms=due_ms,
                                       shard=self._keys.shard_for(call.job_id, call.key).shard)
        headers, properties = message.headers, message.properties
        original, original_properties = dict(headers), dict(properties)
        add_sentry_trace(headers)
        body = tuple(loads(message.body))
        given = loads(message.body)
        signals.before_task_publish.send(
            sender=call.task, body=body, exchange=message.exchange,
            routing_key=message.routing_key, declare=self._declare(message.queue),
            headers=headers, properties=properties,
            retry_policy=dict(self.app.conf.task_publish_retry_policy))
        fields = decode_fields(call.envelope.split("\n", 1)[0])
        stored_headers, stored_properties = fields.get("h", {}), fields.get("p", {})
        # argsrepr / kwargsrepr a handler changes are stored: it hides the arguments
        own = original.keys() - stored_headers.keys() - set(REPRS) | set(DELAYQ_HEADERS)
        own_properties = {name for name, value in original_properties.items()
                          if value == call.task_id}
        if "expires" in fields.get("o", {}):
            own_properties.add("expiration")  # the time left until it, at each publish
        edits: dict[str, Any] = {
            "headers": _left(original, headers, stored_headers, own),
            "properties": _left(original_properties, properties, stored_properties,
                                own_properties),
            "embed": None if _same(body[2], given[2]) else body[2],
            "arguments": None if _same(body[:2], given[:2]) else (body[0], body[1]),
        }
        if any(edit is not None for edit in edits.values()):
            call = as_published(call, **edits, max_payload_bytes=self._max_payload,
                                max_nesting=self._max_nesting)
        return call, Sent(message, body)

    def after(self, call: Call, sent: Sent) -> None:
        """Send ``after_task_publish`` and the ``task-sent`` event of a stored call."""
        message = sent.message
        signals.after_task_publish.send(
            sender=call.task, body=sent.body, headers=message.headers,
            exchange=message.exchange, routing_key=message.routing_key)
        if self.app.conf.task_send_sent_event:
            self._send_event(message)

    def _send_event(self, message: Message) -> None:
        headers = message.headers
        event: dict[str, Any] = {
            "uuid": headers["id"], "root_id": headers["root_id"],
            "parent_id": headers["parent_id"], "name": message.task,
            "args": headers["argsrepr"], "kwargs": headers["kwargsrepr"],
            "retries": headers["retries"], "eta": headers["eta"],
            "expires": headers["expires"], "queue": message.queue,
            "exchange": message.exchange, "routing_key": message.routing_key,
        }
        with self.app.producer_or_acquire() as producer:
            self._events.publish("task-sent", event, producer, retry=True,
                                 retry_policy=self.app.conf.task_publish_retry_policy)

    def _declare(self, queue: str) -> list:
        try:
            return [self.app.amqp.queues[queue]]
        except KeyError:
            return []


def _left(before: dict[str, Any], after: dict[str, Any], stored: dict[str, Any],
          own: set[str]) -> dict[str, Any] | None:
    """The stored part of a message's headers or properties as handlers left them: the
    ``stored`` ones they kept (changed or not), and those they added or changed but the
    ``own`` ones the carrier sets per message; None when that is what was stored."""
    left = {name: value for name, value in after.items()
            if name in stored or (name not in own
                                  and (name not in before or not _same(before[name], value)))}
    return None if _same(left, stored) else left


def _same(one: Any, other: Any) -> bool:
    """Whether two values are stored as the same JSON (``True`` is not ``1``); False
    when one is no JSON (storing it raises then)."""
    try:
        return encode_json(one) == encode_json(other)
    except (TypeError, ValueError, RecursionError):
        return False


def add_sentry_trace(headers: dict[str, Any]) -> None:
    """Add to a message's ``headers`` the trace headers Sentry's ``apply_async`` wrapper adds.

    Only when ``sentry_sdk`` was imported by someone else, is initialised with its Celery
    integration propagating traces, and the call carries no Sentry trace yet (a plain task's
    ``apply_async(countdown=...)`` reaches the store through Sentry's wrapper). They go where
    Sentry's worker side reads them: the nested ``headers`` header (celery#4875), with
    ``sentry-task-enqueued-time`` for its receive latency; Sentry's top-level copies are read
    by nobody and would only take room in the store.
    """
    integration = _sentry_celery()
    nested = headers.get("headers") or {}
    if (integration is None or "sentry-trace" in nested
            or not headers.get("sentry-propagate-traces", integration.propagate_traces)):
        return
    sentry_sdk = sys.modules["sentry_sdk"]
    trace = {"sentry-trace": sentry_sdk.get_traceparent(), "baggage": sentry_sdk.get_baggage()}
    # a new dict: the caller tells added headers by comparing with the old ones
    headers["headers"] = {**nested, **{k: v for k, v in trace.items() if v is not None},
                          "sentry-task-enqueued-time": time.time()}


def _sentry_celery() -> Any:
    """Sentry's Celery integration if ``sentry_sdk`` is imported (never here) and initialised
    with it, else None."""
    sentry_sdk = sys.modules.get("sentry_sdk")
    return None if sentry_sdk is None else sentry_sdk.get_client().get_integration("celery")
