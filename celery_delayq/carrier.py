"""The carrier: promotes due jobs from the store into ordinary Celery queues.

``run()`` loops ``run_once()`` = balance shard leases and recover expired job leases ->
claim due jobs -> publish them (``publisher.py``: one kombu producer) -> ack, then
sleeps until the earliest due time it knows or until a wake message says a new job became a
shard's head. While a claim comes back full, the next claim (with the ack of the batch
before) is sent before a batch is published, so Redis runs it while the carrier publishes,
as long as the last publish took under a third of the lease. With
``delayq_direct_promotion`` the claim script itself pushes plain jobs onto the broker's
queue lists (``direct.py`` says which), and only the rest go through kombu.
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
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import redis
from kombu.exceptions import KombuError
from redis.client import PubSub

from .conf import (
    PASSWORD_SHOWN,
    DelayQConfig,
    check_claim_batch,
    check_handoff_lead,
    check_positive,
    check_task_protocol,
    password_shown,
)
from .connection import redact
from .direct import DirectRouter, broker_is_store_server
from .errors import ConfigurationError, DamagedShard, DelayQError, StoreUnavailable
from .extension import DelayQ
from .keys import ShardKeys
from .memory import CarrierGuard
from .metrics import CarrierMetrics
from .ownership import ShardOwnership
from .persistence import PersistenceWatch
from .promotion_log import PromotionLog
from .publisher import Publisher
from .reading import counted, elapsed
from .stopping import StopFlag
from .store import ClaimAhead, Promoted, ShardClaim

logger = logging.getLogger("celery_delayq.carrier")

_MAINTAIN_EVERY = 1.0  # longest time between shard-lease renewal + lease-recovery sweeps
_WAIT_SLICE = 0.25  # longest uninterrupted wait, so a stop request is seen promptly
_BACKOFF_MAX = 5.0
_MEMORY_WAIT = 0.1  # seconds between looks at a Redis too full to promote into
_RELEASE_ROUNDS = 20  # release calls per shard and maintenance (~7 ms of Redis each)
#: Signals that stop a carrier after its batch in hand (SIGHUP: its terminal or session
#: ended); a second one stops it at once.
_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP")
                      if hasattr(signal, name))


@dataclass
class CarrierStats:
    """Totals since the carrier started."""

    promoted: int = 0
    dead: int = 0
    recovered: int = 0


def _seconds(config: DelayQConfig, given: float | None, name: str, option: str) -> float:
    """The setting ``delayq_<name>``, or the value given for it by ``option`` once checked."""
    return getattr(config, name) if given is None else check_positive(name, given, option)


class Carrier:
    """Promotes due jobs of one app's store; any number may run side by side."""

    def __init__(self, app, *, batch: int | None = None, lease: float | None = None,
                 shard_lease: float | None = None, idle_timeout: float | None = None,
                 direct: bool | None = None, handoff_lead: float | None = None,
                 metrics: CarrierMetrics | None = None) -> None:
        check_task_protocol(app)
        self.app = app
        self.delayq = DelayQ.of(app)
        config = self.delayq.config
        self.store = self.delayq.store
        self.batch = config.claim_batch if batch is None else check_claim_batch(batch)
        self.publisher = Publisher(app, self.store, batch=self.batch)
        self.router = DirectRouter(app, self.store, self.publisher.queue)
        self.lease_ms = int(1000 * _seconds(config, lease, "lease_seconds", "--lease"))
        self.idle_timeout = _seconds(config, idle_timeout, "idle_timeout", "--idle-timeout")
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
        self._pubsub: PubSub | None = None
        shard_lease_ms = int(1000 * _seconds(config, shard_lease, "shard_lease_seconds",
                                             "--shard-lease"))
        self.carrier_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.ownership = ShardOwnership(self.store, self.carrier_id, shard_lease_ms)
        self._maintain_every = min(_MAINTAIN_EVERY, shard_lease_ms / 3000)
        self._next_maintenance = 0.0
        self._shards: list[ShardKeys] = []
        self._ahead: ClaimAhead | None = None  # the next claim, sent while publishing
        self._publish_seconds: float | None = None  # how long the last batch took to publish
        self._over_lease = False  # the last batch took as long as the lease to publish
        #: what reached the broker and Redis has not acked yet: sent with the next claim or
        #: on its own, and again after a failure, until Redis takes it
        self._unacked: dict[ShardKeys, list[Promoted]] = {}
        self._failing: dict[int, str] = {}  # shards whose last claim or recover failed: why
        self._defaults_set = False  # delayq_rate_limits applied (once Redis answered)
        self._store_id: str | None = None  # the id meta held at the last maintenance
        self._joined = False  # it has written its heartbeat (close() takes it back)
        self._releasing: set[str] = set()  # tokens of the stalled releases it goes on with
        self._promotions = PromotionLog(logger)  # the INFO lines of what it promoted

    # -- one iteration -----------------------------------------------------------------

    def run_once(self) -> float:
        """Balance shards, recover, claim, publish, ack once; seconds until work is expected."""
        if self._unacked and self._ahead is None:  # kept by a round that failed: acked
            self._ack_unacked()  # before a recovery takes back the leases that ran out
        recovered = self._maintain() if time.monotonic() >= self._next_maintenance else 0
        if self._memory.braking():  # workers on a shared Redis need room to take messages
            self._settle()
            return _MEMORY_WAIT
        claims, claimed_at = self._claim()
        backlog = any(len(c.jobs) + len(c.promoted) >= self.batch for c in claims)
        self._ack_or_claim_ahead(backlog)
        publishing = time.monotonic()
        self._keep_unacked(self._promote(claims, claimed_at))
        self._note_publish_time(time.monotonic() - publishing)
        if self._ahead is None and self._unacked:  # else acked with the claim after it
            self._ack_unacked()
        if recovered or backlog:
            return 0.0
        return self._sleep_after(claims, claimed_at)

    def _maintain(self) -> int:
        """Check memory and the broker, balance shard leases, recover expired job leases;
        returns how many jobs were recovered."""
        with self.store.unavailable():
            self._check_store()
            self._memory.check_policy()
            self._persistence.check()
            if not self._defaults_set:
                self._set_default_rate_limits()
            if self.direct and not self.router.checked:
                self.router.check_broker()
            self._joined = True
            self._shards = self.ownership.balance()
            self._note_failed_shards("lease", self.ownership.failed)
            # a carrier that died in a backlog held two batches: the last and the next
            recovered, failed = self.store.recover(self._shards, 2 * self.batch)
            self._go_on_with_releases()
        self._note_failed_shards("recover", failed)
        self._next_maintenance = time.monotonic() + self._maintain_every
        if recovered:
            self.stats.recovered += recovered
            if self.metrics:
                self.metrics.recovered.inc(recovered)
            logger.warning("recovered %s whose carrier lease expired",
                           counted(recovered, "job"))
        return recovered

    def _check_store(self) -> None:
        """Read the store's id (one call; the shard count and format are checked with it).
        Another id than the last one means the store was made again: its Redis lost its
        data. Say so once, and set ``delayq_rate_limits`` again."""
        meta = self.store.keys.meta
        try:
            made = self.store.store_id()
        except ConfigurationError as exc:
            if self._store_id is None:  # its first look: as a start is refused
                raise
            raise ConfigurationError(
                f"the store's record {meta} changed while this carrier ran: {exc}") from exc
        known, self._store_id = self._store_id, made
        if known is None or made == known:
            return
        self._defaults_set = False
        logger.error(
            "Redis lost the store's data: %s was gone and is written again (Redis restarted "
            "without persistence, FLUSHALL or FLUSHDB, or a failover to an empty replica). "
            "The jobs stored before are gone, dead letters too, and so are pauses and rate "
            "limits set by hand%s. Turn AOF on (appendonly yes) so that a restart keeps "
            "them; with the Django app, run `manage.py delayq_reconcile --missing` to write "
            "again the rows not yet run (docs/operations.md, 'Redis persistence')", meta,
            "; delayq_rate_limits are set again now" if self.delayq.config.rate_limits
            else "")

    def _set_default_rate_limits(self) -> None:
        """Set the ``delayq_rate_limits`` Redis has no live value of, once; a damaged
        ``limits`` key is logged and left (``delayq rate-limit`` sets them once it is
        moved away), so that it stops only its shard."""
        if self.delayq.config.rate_limits:
            try:
                self.delayq.apply_default_rate_limits()
            except DamagedShard as exc:
                logger.error("delayq_rate_limits could not be set on every shard (%s); set "
                             "them with `celery -A proj delayq rate-limit` once the key is "
                             "moved away", exc)
        self._defaults_set = True

    def _go_on_with_releases(self) -> None:
        """Give back, a few rounds per maintenance, the held jobs of a resume or a rate
        limit's removal whose caller stopped part way (its release stalled)."""
        walks = self.store.stalled_releases(self._shards, self._releasing)
        done = self.store.release_held(walks, _RELEASE_ROUNDS)
        self._releasing = {walk.token for walk in done.going_on}
        self._note_failed_shards("release", done.failed)
        if done.released:
            logger.info("gave back %s that a pause or rate limit no longer holds: the "
                        "resume or removal that began it stopped part way%s",
                        counted(done.released, "held job"),
                        ", going on" if done.going_on else "")

    def _claim(self) -> tuple[list[ShardClaim], float]:
        """The due jobs of the shards served (claimed ahead, or now) and when Redis ran
        the claim (``time.monotonic()``)."""
        started = time.monotonic()
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            claims, claimed_at = self._ahead_result(ahead), ahead.sent_at
        else:
            claims = self.store.claim(self._shards, self.batch, self.lease_ms,
                                      self.router.routes, self.lead_ms)
            claimed_at = time.monotonic()
        self._note_failed_shards("claim", {c.shard: c.error for c in claims if c.error},
                                 served=[c.shard for c in claims if not c.error])
        if self.metrics:
            taken = sum(len(c.jobs) + len(c.promoted) for c in claims)
            self.metrics.observe_claim(taken, time.monotonic() - started)
        return claims, claimed_at

    def _ack_or_claim_ahead(self, backlog: bool) -> None:
        """Ack the batch before; in a backlog, send that ack with the next claim, which
        Redis runs while this batch is published."""
        if backlog and self._can_claim_ahead():
            self._ahead = self.store.claim_ahead(self._shards, self.batch, self.lease_ms,
                                                 self.router.routes, self._unacked,
                                                 self.lead_ms)
            self._unacked = {}  # the claim ahead carries them (ClaimAhead.acks)
        elif self._unacked:
            self._ack_unacked()

    def _ack_unacked(self) -> None:
        """Ack what is unacked. What Redis does not take (a broken connection; on one
        shard, a cluster slot moving) stays, and goes with the next round: dropped, its
        jobs' leases ran out and they were published twice. A shard's failure stops
        only that shard's acks."""
        unacked, self._unacked = self._unacked, {}
        try:
            failed = self.store.ack(unacked, raise_errors=False)
        except (DelayQError, redis.RedisError):
            self._keep_unacked(unacked)
            raise
        self._keep_failed_acks(unacked, failed)

    def _ahead_result(self, ahead: ClaimAhead) -> list[ShardClaim]:
        """The claims of ``ahead``; the acks sent with it that Redis did not take are kept
        for the next round (all of them when its reply failed: not known to be taken)."""
        try:
            claims = ahead.result()
        except (DelayQError, redis.RedisError):
            self._keep_unacked(ahead.acks)
            raise
        self._keep_failed_acks(ahead.acks, ahead.failed_acks)
        return claims

    def _keep_failed_acks(self, acks: dict[ShardKeys, list[Promoted]],
                          failed: dict[ShardKeys, DelayQError]) -> None:
        """Keep the acks of the shards where they failed, and say so once per episode
        (the shard's claims fail too, so what is kept grows by no more than a batch)."""
        self._keep_unacked({shard: acks[shard] for shard in failed})
        self._note_failed_shards("ack", failed)

    def _keep_unacked(self, acks: dict[ShardKeys, list[Promoted]]) -> None:
        for shard, jobs in acks.items():
            self._unacked.setdefault(shard, []).extend(jobs)

    def _sleep_after(self, claims: list[ShardClaim], claimed_at: float) -> float:
        """Seconds until the earliest next due time the claims saw (Redis clock), at most
        the idle timeout and the time to the next maintenance."""
        waits = [c.next_due_ms - c.now_ms for c in claims if c.next_due_ms is not None]
        sleep = min(waits, default=self.idle_timeout * 1000) / 1000
        sleep -= time.monotonic() - claimed_at
        return max(0.0, min(sleep, self.idle_timeout,
                            self._next_maintenance - time.monotonic()))

    def _note_publish_time(self, seconds: float) -> None:
        """Keep how long the batch took to publish; say so (once, until one takes less)
        when it outlasted the lease: its jobs may have been recovered meanwhile, and
        published twice."""
        over = seconds * 1000 >= self.lease_ms
        if over and not self._over_lease:
            logger.warning("publishing a batch took %s, as long as the lease (%s) or longer: "
                           "another carrier may have recovered and published its jobs again; "
                           "raise delayq_lease_seconds (--lease) or lower --batch",
                           elapsed(seconds * 1000), elapsed(self.lease_ms))
        self._over_lease = over
        self._publish_seconds = seconds

    def _can_claim_ahead(self) -> bool:
        """A batch claimed ahead waits through one publish, then takes its own: claim ahead
        only when the last publish took under a third of the lease, or it would be recovered
        (and published twice) before it is acked."""
        return (self._publish_seconds is not None
                and 3 * self._publish_seconds * 1000 < self.lease_ms)

    def _promote(self, claims: list[ShardClaim], claimed_at: float
                 ) -> dict[ShardKeys, list[Promoted]]:
        """Publish the claimed jobs; returns those that reached the broker, to be acked."""
        taken = self.publisher.publish(claims, claimed_at)
        # Reached only when every message is with the broker; otherwise leases expire and
        # the jobs are recovered and published again.
        self.router.meet(self.publisher.known_queues)  # e.g. task_create_missing_queues
        if taken.lateness:
            self._log_batch(taken.lateness)
        else:
            self._promotions.flush_due()
        dead = taken.dead
        if dead:
            self.stats.dead += len(dead)
            if self.metrics:
                self.metrics.dead_lettered.inc(len(dead))
            logger.error("dead-lettered %s (%s%s); list them with `celery delayq ls "
                         "--dead`, replay with `celery delayq replay JOB_ID`",
                         counted(len(dead), "job"), "; ".join(dead[:3]),
                         "; ..." if len(dead) > 3 else "")
        return taken.acks

    def _settle(self) -> tuple[int, int | None]:
        """Ack what reached the broker and give back what was claimed ahead (stop, error).

        An ack Redis does not take now is kept for the next round; what a stopping carrier
        cannot settle is recovered when its lease ends. Returns what is left: jobs
        published and not acked, and jobs claimed ahead and not given back (None: not
        known, the claim's reply was lost).
        """
        ahead, self._ahead = self._ahead, None
        claims: list[ShardClaim] = []
        held: int | None = 0
        if ahead is not None:
            try:
                claims = self._ahead_result(ahead)
            except (DelayQError, redis.RedisError):
                held = None
        if claims:
            try:
                self.store.release(claims)
            except (DelayQError, redis.RedisError):
                held = sum(len(claim.jobs) for claim in claims)
        if self._unacked:
            with contextlib.suppress(DelayQError, redis.RedisError):
                self._ack_unacked()
        return sum(len(jobs) for jobs in self._unacked.values()), held

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
        self.stats.promoted += len(lateness)
        self._promotions.batch(lateness)

    @cached_property
    def _memory(self) -> CarrierGuard:
        store = self.store
        return CarrierGuard(self.delayq.config.max_memory_fraction, store.memory,
                            store.eviction_policies, redact(self.delayq.config.redis_url),
                            shares_broker=lambda: broker_is_store_server(self.app, store))

    @cached_property
    def _persistence(self) -> PersistenceWatch:
        return PersistenceWatch(self.store.persistence)

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> None:
        """Serve until :meth:`stop` (or SIGTERM, SIGINT, SIGHUP), finishing the batch in
        hand. Signal handlers it installs are put back as they were when it returns."""
        previous = self._install_signal_handlers()
        logger.info("carrier started: %d shards, batch %d, lease %.0fs", self.store.keys.shards,
                    self.batch, self.lease_ms / 1000)
        logger.info("serving the store at %s (prefix %r%s), publishing to the broker at %s",
                    redact(self.delayq.config.redis_url), self.store.keys.prefix,
                    "" if self.app.conf.get("delayq_redis_url")
                    else "; delayq_redis_url is not set: the broker's Redis",
                    redact(self.app.conf.broker_url or ""))
        if password_shown(self.app):
            logger.warning(PASSWORD_SHOWN)
        try:
            self._serve()
        except ConfigurationError as exc:  # retrying would not help: as a start is refused
            logger.error("stopping the carrier: %s", exc)
            raise
        finally:
            self.close()
            logger.info("carrier stopped: %d promoted, %d dead-lettered, %d recovered",
                        self.stats.promoted, self.stats.dead, self.stats.recovered)
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _serve(self) -> None:
        """Loop :meth:`run_once` until a stop, waiting out Redis and broker failures."""
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

    def stop(self) -> None:
        """Stop after the batch in hand (safe from a signal handler)."""
        self._stopping.set()

    def _install_signal_handlers(self) -> dict[int, Any]:
        """Stop on the stop signals (in the main thread only); the handlers they had."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {signum: signal.signal(signum, self._on_signal) for signum in _STOP_SIGNALS}

    def _on_signal(self, signum: int, _frame) -> None:
        """The first stop signal stops after the batch in hand; a second, now (as a kill
        would: no call of the store or the broker, which may be what it waits on)."""
        if self._stopping.requested:
            os.write(2, f"carrier: {signal.Signals(signum).name} again, stopping now; the "
                        "jobs it holds are recovered when their lease ends\n".encode())
            os._exit(1)
        self.stop()

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
            self._pubsub = self.store.subscribe(self.store.keys.wake_channel)
        return self._pubsub

    def _reset_connections(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(redis.RedisError):
                self._pubsub.close()
            self._pubsub = None
        self.publisher.reset()

    def close(self) -> None:
        """Settle the jobs in hand, hand the shards back and close connections."""
        unacked, held = self._settle()
        if unacked or held != 0:
            logger.warning(_unsettled(unacked, held, self.lease_ms))
        self._promotions.flush()
        try:
            if self._joined:  # a carrier refused at its start wrote no heartbeat
                with self.store.unavailable():
                    self.ownership.release()
        except DelayQError as exc:  # unavailable, or a lease key damaged
            logger.warning("could not release shard leases (they expire): %s", exc)
        self._reset_connections()


def _unsettled(unacked: int, held: int | None, lease_ms: int) -> str:
    """What a stopping carrier whose Redis did not answer leaves to its job leases."""
    left = [f"{counted(unacked, 'published job')} not acknowledged"] if unacked else []
    if held != 0:
        left.append(f"{'the jobs' if held is None else counted(held, 'job')} claimed ahead "
                    "not given back")
    said = (f"stopping with {' and '.join(left)} (Redis did not answer): they are due "
            f"again when their leases end, within {lease_ms / 1000:g}s")
    return said + (f"; the {unacked} published will be published again" if unacked else "")
