"""Claimed jobs -> Celery messages -> the broker: the carrier's publish step.

:meth:`Publisher.take` is the step the carrier and the pytest plugin share: each claimed
job's message is built and handed to a sender, a job whose stored form is bad is
dead-lettered with its reason, and what was sent is returned, to be acked. The carrier's
sender publishes through one kombu producer (:meth:`Publisher.publish`: into the channel's
publish batch, one pipeline per batch on a Redis broker, kombu >= 5.7), on a connection
that waits for the broker at most the store's socket timeout (``broker.py``); the plugin's
keeps the messages and runs them in the test's process.

Only :data:`JOB_ERRORS`, which mean the stored job is bad, dead-letter a job. A failure of
the broker or of Redis fails the batch. Any other exception raised for one job is not the
job's fault (a bug of ours, a setting): the carrier logs it with its traceback and leaves
the job leased, neither published nor dead-lettered, so it is recovered when its lease ends
and tried again as stored; every other job goes on.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import redis
from kombu.entity import maybe_delivery_mode
from kombu.exceptions import KombuError, SerializationError

from . import broker
from .errors import PayloadError, StoreUnavailable, UnknownQueue
from .keys import ShardKeys
from .message import Message, MessageBuilder
from .reading import counted, shown
from .store import Claimed, Promoted, ShardClaim, Store

logger = logging.getLogger("celery_delayq.carrier")

#: What one job raises when its stored form cannot be published: an unreadable envelope or
#: id, a due score that is no finite number, an envelope over ``delayq_max_payload_bytes``
#: (``PayloadError``), a queue the app does not define, a kombu serialisation error.
JOB_ERRORS: tuple[type[Exception], ...] = (PayloadError, UnknownQueue, SerializationError)
_PUBLISH_RETRY = {"max_retries": 3, "interval_start": 0, "interval_step": 0.5,
                  "interval_max": 2}
_JSON = "application/json"
_REASON_MAX = 500  # characters of a dead letter's reason

#: Sends one job's message on (published, or kept to run in-process).
Sender = Callable[[Message], None]


@dataclass
class Taken:
    """What one :meth:`Publisher.take` did with a batch of claims."""

    acks: dict[ShardKeys, list[Promoted]] = field(default_factory=lambda: defaultdict(list))
    sent: list[tuple[Promoted, Message]] = field(default_factory=list)
    lateness: list[float] = field(default_factory=list)  # ms, per sent job
    dead: list[str] = field(default_factory=list)  # "job id: reason" per dead-lettered job
    failed: list[str] = field(default_factory=list)  # ids left leased after an error of ours


class Publisher:
    """Builds and publishes the messages of one app's claimed jobs."""

    def __init__(self, app, store: Store, *, batch: int) -> None:
        self.app = app
        self.store = store
        self.batch = batch
        self._max_payload = store.config.max_payload_bytes
        self._queues: dict[str, tuple[Any, int]] = {}
        self._declared: set[str] = set()  # queues declared on the current connection
        self._producer: Any = None  # kombu's, made on first use
        self._session: Any = None  # the channel's publish batch while a batch is published

    @cached_property
    def messages(self) -> MessageBuilder:
        """Built on first use, once the app is configured."""
        return MessageBuilder(self.app)

    # -- the step ----------------------------------------------------------------------

    def take(self, claims: list[ShardClaim], send: Sender, claimed_at: float | None = None,
             *, keep_going: bool = False) -> Taken:
        """Build each claimed job's message and ``send`` it; dead-letter a job whose stored
        form is bad (:data:`JOB_ERRORS`). Any other exception is raised, or with
        ``keep_going`` (unless the broker or Redis failed) logged, the job left leased.
        Lateness is measured on Redis's clock when ``claimed_at`` (``time.monotonic()`` at
        the claim) is given."""
        taken = Taken(lateness=[c.now_ms - due for c in claims for due in c.promoted])
        for claim in claims:
            if claim.pushed:
                taken.acks[claim.shard] += claim.pushed
            for job in claim.jobs:
                promoted = self._take_one(claim.shard, job, send, taken, keep_going)
                if promoted is None:
                    continue
                taken.acks[claim.shard].append(promoted)
                if claimed_at is not None:
                    redis_now = claim.now_ms + (time.monotonic() - claimed_at) * 1000
                    taken.lateness.append(redis_now - promoted.due_ms)
        return taken

    def _take_one(self, shard: ShardKeys, job: Claimed, send: Sender, taken: Taken,
                  keep_going: bool) -> Promoted | None:
        """One job's message, sent; None when the job was dead-lettered or left leased."""
        try:
            message = self.message_of(shard, job)
            send(message)
        except JOB_ERRORS as exc:
            taken.dead.append(self._dead_letter(shard, job, exc))
            return None
        except Exception as exc:
            if not keep_going or isinstance(exc, self._batch_errors):
                raise  # with keep_going, the broker or Redis failed: the batch fails
            # not the stored job's fault (a bug of ours, a setting): no dead letter
            logger.exception("error promoting job %s, not caused by its stored data: it is "
                             "left leased, recovered when the lease ends and tried again",
                             shown(job.job_id))
            taken.failed.append(job.job_id)
            return None
        assert job.due_ms is not None  # else message_of() refused it
        promoted = Promoted(job.job_id, message.task, message.key, job.due_ms,
                            job.stored_id, job.lease, message.headers.get("id") or "")
        taken.sent.append((promoted, message))
        return promoted

    def message_of(self, shard: ShardKeys, job: Claimed) -> Message:
        """The message of one claimed job; :class:`PayloadError` when it has none."""
        raw = job.envelope
        if raw is not None and len(raw) > self._max_payload:
            raise PayloadError("envelope over delayq_max_payload_bytes")
        return self.messages.build(job.job_id, raw, shard=shard.shard, due_ms=job.due_ms)

    def _dead_letter(self, shard: ShardKeys, job: Claimed, exc: Exception) -> str:
        """Move a job to the dead letters; returns "job id: reason" for the batch log, as
        ``reading.shown`` prints it (one line a strict UTF-8 log file takes)."""
        reason = str(exc.args[0]) if exc.args else type(exc).__name__
        reason = reason[:_REASON_MAX]
        self.store.dead_letter(shard, job, reason)
        return shown(f"{job.job_id}: {reason}")

    # -- publishing through kombu --------------------------------------------------------

    def publish(self, claims: list[ShardClaim], claimed_at: float) -> Taken:
        """Publish the claimed jobs as one batch; returns what reached the broker.

        Returns only when every message is with the broker; otherwise the batch is given
        back (or, failing that, its leases expire and it is recovered) and the error raised.
        """
        with self._released_on_failure(claims), self._publish_batch():
            return self.take(claims, self.deliver, claimed_at, keep_going=True)

    def deliver(self, message: Message) -> None:
        """Into the channel's publish batch, or published now when there is none."""
        queue, delivery_mode = self.queue(message.queue)
        mode = message.properties.pop("delivery_mode", None)  # the call's own, as in kombu
        if mode:
            delivery_mode = maybe_delivery_mode(mode)
        if self._session is not None:
            self._send(message, queue, delivery_mode)
            return
        declare = [] if queue.name in self._declared else [queue]
        self.producer.publish(
            message.body, exchange=message.exchange, routing_key=message.routing_key,
            content_type=_JSON, content_encoding="utf-8", headers=message.headers,
            declare=declare, delivery_mode=delivery_mode, retry=True,
            retry_policy=_PUBLISH_RETRY, **message.properties,
        )
        self._declared.add(queue.name)

    def queue(self, name: str) -> tuple[Any, int]:
        """The kombu queue of a name and its delivery mode, resolved once; UnknownQueue for
        one whose broker list would be a key of the store (stored before calls refused it)."""
        found = self._queues.get(name)
        if found is None:
            problem = self.store.keys.queue_problem(name, broker.global_keyprefix(self.app))
            if problem is not None:
                raise UnknownQueue(problem)
            try:
                queue = self.app.amqp.queues[name]
            except KeyError:
                raise UnknownQueue(f"unknown queue {name!r} (task_create_missing_queues is "
                                   "off)") from None
            mode = maybe_delivery_mode(
                queue.exchange.delivery_mode or self.app.conf.task_default_delivery_mode)
            found = self._queues[name] = (queue, mode)
        return found

    @property
    def known_queues(self) -> list[str]:
        """The queues resolved so far."""
        return list(self._queues)

    @contextlib.contextmanager
    def _released_on_failure(self, claims: list[ShardClaim]) -> Iterator[None]:
        """If publishing fails, give the batch back at once instead of after its lease.

        Part of it may have reached the broker: those jobs run twice (same task id).
        """
        try:
            yield
        except BaseException:
            with contextlib.suppress(StoreUnavailable, redis.RedisError):
                released = self.store.release(claims)
                logger.warning("gave %s back after a failed publish",
                               counted(released, "claimed job"))
            raise

    def _publish_batch(self):
        """The channel's publish batch (one pipeline on Redis, kombu >= 5.7), else none.

        Publishes inside a batch only buffer commands, so they need no per-message retry:
        a failed flush fails the batch, which is then not acknowledged.
        """
        channel = self.producer.channel
        create = getattr(channel, "create_publish_batch", None)
        if create is None or not getattr(channel, "supports_batch_publish", False):
            return contextlib.nullcontext()
        return self._channel_batch(create)

    @contextlib.contextmanager
    def _channel_batch(self, create) -> Iterator[None]:
        self._session = session = create(max_size=self.batch * self.store.keys.shards)
        try:
            yield
            session.flush()
        except BaseException:
            session.discard()
            raise
        finally:
            self._session = None
            session.close()

    @cached_property
    def _batch_errors(self) -> tuple[type[BaseException], ...]:
        """Exceptions that mean the broker or Redis failed, not the job in hand (kombu's
        serialisation errors, the job's own, are caught before these)."""
        connection = self.producer.connection
        return (StoreUnavailable, redis.RedisError, OSError, KombuError,
                *connection.connection_errors, *connection.channel_errors)

    def _send(self, message: Message, queue, delivery_mode: int) -> None:
        """Into the channel's batch, the message ``Producer.publish`` would send, without
        its per-call work (options merge, retry)."""
        if queue.name not in self._declared:
            self.producer.maybe_declare(queue, retry=True, **_PUBLISH_RETRY)
            self._declared.add(queue.name)
        properties = message.properties
        priority = properties.pop("priority", 0)
        expiration = properties.pop("expiration", None)
        properties["delivery_mode"] = delivery_mode
        if expiration is not None:
            properties["expiration"] = str(int(expiration * 1000))
        prepared = self.producer.channel.prepare_message(
            message.body, priority, _JSON, "utf-8", message.headers, properties)
        self._session.publish(prepared, exchange=message.exchange,
                              routing_key=message.routing_key, mandatory=False,
                              immediate=False, timeout=None, confirm_timeout=None)

    @property
    def producer(self):
        """A producer on a connection of its own, which waits at most the store's socket
        timeout for the broker (``broker.py``)."""
        if self._producer is None:
            connection = broker.connection(self.app, self.store.config.redis_socket_timeout)
            broker.channel(connection)  # opened now: settings kombu refuses are said so
            self._producer = self.app.amqp.Producer(connection)
            self._declared.clear()
        return self._producer

    def reset(self) -> None:
        """Close the producer and its connection (after a connection error, or on close)."""
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception):  # a connection already broken
                producer.connection.release()
