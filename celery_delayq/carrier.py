"""The carrier: promotes due jobs from the store into ordinary Celery queues.

``run()`` loops ``run_once()`` = balance shard leases and recover expired job leases ->
claim due jobs -> publish them through one pooled kombu producer -> ack, then sleeps until
the earliest due time it knows or until a wake message says a new job became a shard's
head. While a claim comes back full, the next claim (with the ack of the batch before) is
sent before a batch is published, so Redis runs it while the carrier publishes, as long as
the last publish took under a third of the lease. With
``delayq_direct_promotion`` the claim script itself pushes plain jobs onto the broker's
queue lists, and only the rest go through kombu.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import redis
from kombu.entity import maybe_delivery_mode
from kombu.exceptions import KombuError, SerializationError
from redis.client import PubSub
from redis.cluster import RedisCluster

from .conf import check_handoff_lead
from .connection import redact
from .envelope import ORIGIN
from .errors import (
    ConfigurationError,
    DamagedShard,
    DelayQError,
    PayloadError,
    StoreUnavailable,
    UnknownQueue,
)
from .extension import DelayQ
from .keys import ShardKeys, broker_queue
from .memory import CarrierGuard
from .message import Message, MessageBuilder
from .metrics import CarrierMetrics
from .ownership import ShardOwnership
from .reading import counted, printable
from .stopping import StopFlag
from .store import ClaimAhead, Claimed, DirectRoutes, Promoted, ShardClaim

logger = logging.getLogger("celery_delayq.carrier")

_MAINTAIN_EVERY = 1.0  # longest time between shard-lease renewal + lease-recovery sweeps
_WAIT_SLICE = 0.25  # longest uninterrupted wait, so a stop request is seen promptly
_BACKOFF_MAX = 5.0
_MEMORY_WAIT = 0.1  # seconds between looks at a Redis too full to promote into
_PUBLISH_RETRY = {"max_retries": 3, "interval_start": 0, "interval_step": 0.5,
                  "interval_max": 2}
_JSON = "application/json"
_REASON_MAX = 500  # characters of a dead letter's reason


@dataclass
class CarrierStats:
    """Totals since the carrier started."""

    promoted: int = 0
    dead: int = 0
    recovered: int = 0


class Carrier:
    """Promotes due jobs of one app's store; any number may run side by side."""

    def __init__(self, app, *, batch: int | None = None, lease: float | None = None,
                 shard_lease: float | None = None, idle_timeout: float | None = None,
                 direct: bool | None = None, handoff_lead: float | None = None,
                 metrics: CarrierMetrics | None = None) -> None:
        self.app = app
        self.delayq = DelayQ.of(app)
        config = self.delayq.config
        self.store = self.delayq.store
        self.batch = batch or config.claim_batch
        self._max_payload = config.max_payload_bytes
        self._messages = MessageBuilder(app)
        self.lease_ms = int((lease or config.lease_seconds) * 1000)
        self.idle_timeout = idle_timeout or config.idle_timeout
        self.direct = config.direct_promotion if direct is None else direct
        self.lead_ms = round(1000 * (config.handoff_lead if handoff_lead is None
                                     else check_handoff_lead(app, handoff_lead)))
        if self.direct and config.cluster:
            raise ConfigurationError(
                "direct promotion needs the store on the broker's Redis; a Redis Cluster "
                "store cannot push to broker queues")
        self.stats = CarrierStats()
        self.metrics = metrics
        self._stopping = StopFlag()
        self._queues: dict[str, tuple[Any, int]] = {}
        self._declared: set[str] = set()  # queues declared on the current connection
        self._producer: Any = None  # kombu's, from the app's pool on first use
        self._session: Any = None  # the channel's publish batch while a batch is published
        self._pubsub: PubSub | None = None
        shard_lease_ms = int((shard_lease or config.shard_lease_seconds) * 1000)
        self.carrier_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.ownership = ShardOwnership(self.store, self.carrier_id, shard_lease_ms)
        self._maintain_every = min(_MAINTAIN_EVERY, shard_lease_ms / 3000)
        self._next_maintenance = 0.0
        self._shards: list[ShardKeys] = []
        self._direct: DirectRoutes | None = None  # the queues the claim script pushes to
        self._broker_prefix: str | None = None  # set once the broker is known to be the store
        self._considered: set[str] = set()  # queue names looked at for direct promotion
        self._ahead: ClaimAhead | None = None  # the next claim, sent while publishing
        self._publish_seconds: float | None = None  # how long the last batch took to publish
        self._unacked: dict[ShardKeys, list[Promoted]] = {}  # to be acked with it
        self._failing: dict[int, str] = {}  # shards whose last claim or recover failed: why
        self._defaults_set = False  # delayq_rate_limits applied (once Redis answered)

    # -- one iteration -----------------------------------------------------------------

    def run_once(self) -> float:
        """Balance shards, recover, claim, publish, ack once; seconds until work is expected."""
        recovered = 0
        if time.monotonic() >= self._next_maintenance:
            with self.store.unavailable():
                self._memory.check_policy()
                if not self._defaults_set:
                    self.delayq.apply_default_rate_limits()
                    self._defaults_set = True
                if self.direct and self._broker_prefix is None:
                    self._check_broker()
                self._shards = self.ownership.balance()
                # a carrier that died in a backlog held two batches: the last and the next
                recovered, failed = self.store.recover(self._shards, 2 * self.batch)
            self._note_failed_shards("recover", failed)
            self._next_maintenance = time.monotonic() + self._maintain_every
            if recovered:
                self.stats.recovered += recovered
                if self.metrics:
                    self.metrics.recovered.inc(recovered)
                logger.warning("recovered %s whose carrier lease expired",
                               counted(recovered, "job"))
        if self._memory.braking():  # workers on a shared Redis need room to take messages
            self._settle()
            return _MEMORY_WAIT
        started = time.monotonic()
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            claims, claimed_at = ahead.result(), ahead.sent_at
        else:
            claims = self.store.claim(self._shards, self.batch, self.lease_ms, self._direct,
                                      self.lead_ms)
            claimed_at = time.monotonic()
        self._note_failed_shards("claim", {c.shard: c.error for c in claims if c.error},
                                 served=[c.shard for c in claims if not c.error])
        taken = [len(c.jobs) + len(c.promoted) for c in claims]
        if self.metrics:
            self.metrics.observe_claim(sum(taken), time.monotonic() - started)
        backlog = any(n >= self.batch for n in taken)
        if backlog and self._can_claim_ahead():
            # Redis acks the last batch and claims the next while this one is published
            self._ahead = self.store.claim_ahead(self._shards, self.batch, self.lease_ms,
                                                 self._direct, self._unacked, self.lead_ms)
        elif self._unacked:
            self.store.ack(self._unacked)
        self._unacked = {}
        publishing = time.monotonic()
        acks = self._promote(claims, claimed_at)
        self._publish_seconds = time.monotonic() - publishing
        if self._ahead is not None:
            self._unacked = acks
        elif acks:
            self.store.ack(acks)
        if recovered or backlog:
            return 0.0
        waits = [c.next_due_ms - c.now_ms for c in claims if c.next_due_ms is not None]
        sleep = min(waits, default=self.idle_timeout * 1000) / 1000
        sleep -= time.monotonic() - claimed_at
        return max(0.0, min(sleep, self.idle_timeout,
                            self._next_maintenance - time.monotonic()))

    def _can_claim_ahead(self) -> bool:
        """A batch claimed ahead waits through one publish, then takes its own: claim ahead
        only when the last publish took under a third of the lease, or it would be recovered
        (and published twice) before it is acked."""
        return (self._publish_seconds is not None
                and 3 * self._publish_seconds * 1000 < self.lease_ms)

    def _promote(self, claims: list[ShardClaim], claimed_at: float
                 ) -> dict[ShardKeys, list[Promoted]]:
        """Publish the claimed jobs; returns those that reached the broker, to be acked."""
        acks: dict[ShardKeys, list[Promoted]] = defaultdict(list)
        lateness: list[float] = [c.now_ms - due for c in claims for due in c.promoted]
        dead: list[str] = []
        with self._released_on_failure(claims), self._publish_batch():
            for claim in claims:
                for job in claim.jobs:
                    sent = self._publish(claim.shard, job, dead)
                    if sent is None:
                        continue
                    acks[claim.shard].append(sent)
                    redis_now = claim.now_ms + (time.monotonic() - claimed_at) * 1000
                    lateness.append(redis_now - sent.due_ms)
        # Reached only when every message is with the broker; otherwise leases expire and
        # the jobs are recovered and published again.
        if lateness:
            self._log_batch(lateness)
        if dead:
            self.stats.dead += len(dead)
            if self.metrics:
                self.metrics.dead_lettered.inc(len(dead))
            logger.error("dead-lettered %s (%s%s); list them with `celery delayq ls "
                         "--dead`, replay with `celery delayq replay JOB_ID`",
                         counted(len(dead), "job"), "; ".join(dead[:3]),
                         "; ..." if len(dead) > 3 else "")
        return acks

    def _settle(self) -> None:
        """Ack what reached the broker and give back what was claimed ahead (stop, error).

        What cannot be settled now is recovered when its lease ends.
        """
        ahead, self._ahead = self._ahead, None
        unacked, self._unacked = self._unacked, {}
        with contextlib.suppress(DelayQError, redis.RedisError):
            if ahead is not None:
                claims = ahead.result()  # acks what was sent with it, too
                self.store.release(claims)
            if unacked:
                self.store.ack(unacked)

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

    def _publish(self, shard: ShardKeys, job: Claimed, dead: list[str]) -> Promoted | None:
        """Publish one claimed job; dead-letter it (noted in ``dead``) when it cannot be.

        A failure of the broker or of Redis fails the batch. Any other exception is the
        job's own: the job is dead-lettered (replayable) and every other job goes on. An
        exception that is not a known data error may be a bug of ours: it is logged with
        its traceback, and the dead letter says so.
        """
        raw = job.envelope
        try:
            if raw is not None and len(raw) > self._max_payload:
                raise PayloadError("envelope over delayq_max_payload_bytes")
            message = self._messages.build(job.job_id, raw, shard=shard.shard,
                                           due_ms=job.due_ms)
            queue, delivery_mode = self._queue(message.queue)
            self._deliver(message, queue, delivery_mode)
        except (PayloadError, UnknownQueue, SerializationError) as exc:
            dead.append(self._dead_letter(shard, job, exc))
            return None
        except self._batch_errors:
            raise
        except Exception as exc:  # one job must never stop the others
            logger.exception("unexpected error promoting job %s; it is dead-lettered, replay "
                             "it with `celery delayq replay %s` once the cause is fixed",
                             printable(job.job_id), printable(job.job_id))
            dead.append(self._dead_letter(shard, job, exc, internal=True))
            return None
        assert job.due_ms is not None  # else build() refused it
        if self._broker_prefix is not None and queue.name not in self._considered:
            # e.g. created by task_create_missing_queues
            self._route_directly(self._broker_prefix, [queue.name])
        return Promoted(job.job_id, message.task, message.key, job.due_ms, job.stored_id,
                        job.lease)

    def _deliver(self, message: Message, queue, delivery_mode: int) -> None:
        """Into the channel's publish batch, or published now when there is none."""
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

    def _check_broker(self) -> None:
        """Make sure the broker is the store's Redis, then route its queues directly."""
        with self.app.connection_for_write() as connection:
            store = self.store.client  # not a cluster: refused with direct promotion
            same = (connection.transport.driver_type == "redis"
                    and isinstance(store, redis.Redis)
                    and _same_database(connection.default_channel.client, store))
            options = connection.transport_options
        if not same:
            raise ConfigurationError(
                "delayq_direct_promotion needs the delay store on the broker's Redis server "
                f"and database; the broker is {redact(self.app.conf.broker_url or '')}, the "
                f"store {redact(self.delayq.config.redis_url)}. Point delayq_redis_url at the "
                "broker or turn delayq_direct_promotion off.")
        self._broker_prefix = prefix = options.get("global_keyprefix", "")
        self._route_directly(prefix, list(self.app.amqp.queues))

    def _route_directly(self, prefix: str, names: list[str]) -> None:
        """Let the claim script push to these queues too (all but those with x-expires)."""
        self._considered.update(names)
        routed = [name for name, _ in self._direct.queues] if self._direct else []
        routed += [name for name in names if not self._queue(name)[0].expires]
        self._direct = DirectRoutes(
            lists=[broker_queue(prefix, name) for name in routed],
            queues=[(name, self._queue(name)[1]) for name in routed],
            origin=ORIGIN, repr_max=self.app.amqp.argsrepr_maxsize)
        logger.info("direct promotion into %s", ", ".join(routed))

    def _queue(self, name: str) -> tuple[Any, int]:
        """The kombu queue of a name and its delivery mode, resolved once."""
        found = self._queues.get(name)
        if found is None:
            try:
                queue = self.app.amqp.queues[name]
            except KeyError:
                raise UnknownQueue(f"unknown queue {name!r} (task_create_missing_queues is "
                                   "off)") from None
            mode = maybe_delivery_mode(
                queue.exchange.delivery_mode or self.app.conf.task_default_delivery_mode)
            found = self._queues[name] = (queue, mode)
        return found

    def _dead_letter(self, shard: ShardKeys, job: Claimed, exc: Exception,
                     internal: bool = False) -> str:
        """Move a job to the dead letters; returns "job id: reason" for the batch log (bytes
        that are not UTF-8 shown as ``\\xNN``, so a strict UTF-8 log file takes the line)."""
        reason = str(exc.args[0]) if exc.args else type(exc).__name__
        if internal:
            reason = (f"carrier error {type(exc).__name__}: {reason} (see the carrier log; "
                      "replay once fixed)")
        reason = reason[:_REASON_MAX]
        self.store.dead_letter(shard, job, reason)
        return printable(f"{job.job_id}: {reason}")

    def _note_failed_shards(self, step: str, failed: dict[ShardKeys, DelayQError],
                            served: Sequence[ShardKeys] = ()) -> None:
        """Log a shard that fails (once per episode) and when it works again."""
        for shard, error in failed.items():
            if shard.shard not in self._failing:
                logger.error("shard %d cannot be served (%s): %s", shard.shard, step, error)
            self._failing[shard.shard] = str(error)
            if self.metrics:
                self.metrics.shard_errors.labels(str(shard.shard)).inc()
        for shard in served:
            if self._failing.pop(shard.shard, None) is not None:
                logger.info("shard %d is served again", shard.shard)

    def _log_batch(self, lateness: list[float]) -> None:
        if self.metrics:
            self.metrics.observe_promoted(lateness)
        lateness.sort()
        self.stats.promoted += len(lateness)
        logger.info("promoted %s; lateness p50 %.1f ms, max %.1f ms", counted(len(lateness), "job"),
                    lateness[len(lateness) // 2], lateness[-1])

    @cached_property
    def _memory(self) -> CarrierGuard:
        store = self.store
        return CarrierGuard(self.delayq.config.max_memory_fraction, store.memory,
                            store.eviction_policies, redact(self.delayq.config.redis_url),
                            shares_broker=self._broker_is_store_server)

    def _broker_is_store_server(self) -> bool:
        """True when the broker is the store's Redis server (any database)."""
        with self.app.connection_for_write() as connection:
            if connection.transport.driver_type != "redis":
                return False
            return _run_id(connection.default_channel.client) == _run_id(self.store.client)

    @property
    def producer(self):
        if self._producer is None:
            self._producer = self.app.producer_pool.acquire(block=True)
            self._declared.clear()
        return self._producer

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> None:
        """Serve until :meth:`stop` (or SIGTERM/SIGINT), finishing the batch in hand."""
        self._install_signal_handlers()
        logger.info("carrier started: %d shards, batch %d, lease %.0fs",
                    self.store.keys.shards, self.batch, self.lease_ms / 1000)
        failures = 0
        while not self._stopping.requested:
            try:
                self._subscribe()  # before claiming, so no wake can slip between the two
                sleep = self.run_once()
                if failures:
                    logger.info("carrier recovered after %d failed attempts", failures)
                failures = 0
                self._wait(sleep)
            except (StoreUnavailable, DamagedShard, redis.RedisError, KombuError,
                    OSError) as exc:
                if failures == 0:
                    logger.error("carrier paused: %s; retrying with backoff", exc)
                failures += 1
                self._settle()
                self._reset_connections()
                self._stopping.sleep(min(_BACKOFF_MAX, 0.1 * 2 ** failures))
        self.close()
        logger.info("carrier stopped: %d promoted, %d dead-lettered, %d recovered",
                    self.stats.promoted, self.stats.dead, self.stats.recovered)

    def stop(self) -> None:
        """Stop after the batch in hand (safe from a signal handler)."""
        self._stopping.set()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: self.stop())

    def _wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``, returning early on a wake message or a stop."""
        pubsub = self._subscribe()
        deadline = time.monotonic() + seconds
        while not self._stopping.requested:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if pubsub.get_message(timeout=min(left, _WAIT_SLICE)) is not None:
                while pubsub.get_message(timeout=0) is not None:
                    pass  # several wakes mean one more look
                return

    def _subscribe(self) -> PubSub:
        if self._pubsub is None:
            self._pubsub = self.store.pubsub()
            self._pubsub.subscribe(self.store.keys.wake_channel)
        return self._pubsub

    def _reset_connections(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(redis.RedisError):
                self._pubsub.close()
            self._pubsub = None
        if self._producer is not None:
            self._producer.release()
            self._producer = None

    def close(self) -> None:
        """Settle the jobs in hand, hand the shards back and close connections."""
        self._settle()
        try:
            with self.store.unavailable():
                self.ownership.release()
        except StoreUnavailable as exc:
            logger.warning("could not release shard leases (they expire): %s", exc)
        self._reset_connections()


def _run_id(client: redis.Redis | RedisCluster) -> str:
    """The run id of the Redis server a client reaches."""
    return client.info("server")["run_id"]


def _same_database(broker: redis.Redis, store: redis.Redis) -> bool:
    """True when two clients reach the same Redis server (by run id) and database."""
    def where(client: redis.Redis) -> tuple[str, int]:
        return _run_id(client), int(client.connection_pool.connection_kwargs.get("db") or 0)
    return where(broker) == where(store)
