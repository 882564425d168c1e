"""Prometheus metrics of a carrier (``celery -A proj delayq carrier --metrics-port 9808``).

What the carrier did is counted as it happens (promoted, recovered, dead-lettered,
lateness, batch sizes, Redis round trips); what the store holds (pending per shard and
task, overdue, in flight, dead, cancels) is read from Redis at scrape time, so every
carrier reports the same truth. Needs ``pip install celery-delayq[metrics]``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .errors import ConfigurationError, DelayQError
from .store import Store

try:
    from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    _HAVE_PROMETHEUS = True
except ImportError:  # pragma: no cover - exercised only without the extra
    _HAVE_PROMETHEUS = False

_LATENESS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                     30, 60)
_BATCH_BUCKETS = (1, 10, 50, 100, 250, 500, 1000, 2000, 5000)
_ROUNDTRIP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)


class CarrierMetrics:
    """The carrier's counters and histograms, plus the store read at scrape time."""

    def __init__(self, store: Store) -> None:
        if not _HAVE_PROMETHEUS:
            raise ConfigurationError(
                "metrics need prometheus_client: pip install 'celery-delayq[metrics]'")
        self.registry = CollectorRegistry()
        r = self.registry
        self.promoted = Counter("delayq_promoted", "Jobs published into the broker.",
                                registry=r)
        self.recovered = Counter("delayq_recovered",
                                 "Jobs returned to the due set after a carrier lease expired.",
                                 registry=r)
        self.dead_lettered = Counter("delayq_dead_lettered",
                                     "Jobs moved to the dead letters by this carrier.",
                                     registry=r)
        self.shard_errors = Counter("delayq_shard_errors",
                                    "Claims or recovers of a shard that failed (e.g. a key "
                                    "of the shard holds the wrong type).",
                                    ["shard"], registry=r)
        self.lateness = Histogram("delayq_promotion_lateness_seconds",
                                  "Publish time minus due time (Redis clock).",
                                  buckets=_LATENESS_BUCKETS, registry=r)
        self.batch_size = Histogram("delayq_claim_batch_size",
                                    "Jobs claimed per claim round trip (all shards).",
                                    buckets=_BATCH_BUCKETS, registry=r)
        self.roundtrip = Histogram("delayq_redis_roundtrip_seconds",
                                   "Time the carrier waited for a claim's reply from Redis "
                                   "(a claim sent ahead in a backlog is mostly answered "
                                   "before it is read).",
                                   buckets=_ROUNDTRIP_BUCKETS, registry=r)
        r.register(StoreCollector(store))

    def observe_claim(self, claimed: int, seconds: float) -> None:
        self.batch_size.observe(claimed)
        self.roundtrip.observe(seconds)

    def observe_promoted(self, lateness_ms: list[float]) -> None:
        self.promoted.inc(len(lateness_ms))
        for ms in lateness_ms:
            self.lateness.observe(max(ms, 0) / 1000)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve ``/metrics`` on a background thread; :class:`ConfigurationError` when the
        address cannot be had (a port in use: another carrier on this host?)."""
        try:
            start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc} (another "
                "carrier on this host may hold the port); choose another --metrics-port"
            ) from exc


class StoreCollector:
    """Gauges of the store's contents, read from Redis on every scrape."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def describe(self) -> list:
        return []  # metrics depend on Redis: nothing to describe before a scrape

    def collect(self) -> Iterator[Any]:
        try:
            rows = self.store.stats()
            tasks, cancelled = self.store.counts()
        except DelayQError:
            return  # an unreachable store shows as missing series, not a failed scrape
        per_shard = {
            "delayq_pending_jobs": ("Jobs waiting for their due time.", "pending"),
            "delayq_overdue_jobs": ("Jobs due but not yet claimed by a carrier.", "overdue"),
            "delayq_paused_jobs": ("Due jobs held by a pause of their task or queue (pending, "
                                   "not overdue).", "paused"),
            "delayq_rate_limited_jobs": ("Due jobs held by their queue's rate limit until it "
                                         "has room (pending, not overdue).", "rate_limited"),
            "delayq_inflight_jobs": ("Jobs claimed and being published.", "inflight"),
            "delayq_dead_jobs": ("Dead-lettered jobs kept for replay.", "dead"),
            "delayq_unreadable_due_jobs": ("Pending jobs whose due score is no time (+-inf, "
                                           "after the year 9999).", "unreadable_due"),
        }
        for name, (doc, field) in per_shard.items():
            gauge = GaugeMetricFamily(name, doc, labels=["shard"])
            for row in rows:
                gauge.add_metric([str(row["shard"])], row[field])
            yield gauge
        damaged = GaugeMetricFamily("delayq_damaged_shard",
                                    "1 while a key of the shard holds the wrong type of value "
                                    "(the shard is not served), else 0.", labels=["shard"])
        for row in rows:
            damaged.add_metric([str(row["shard"])], 1 if row["damaged"] else 0)
        yield damaged
        stored = GaugeMetricFamily("delayq_stored_jobs",
                                   "Jobs stored per task (pending or being promoted).",
                                   labels=["task"])
        for task, n in sorted(tasks.items()):
            stored.add_metric([task], n)
        yield stored
        yield GaugeMetricFamily("delayq_oldest_overdue_seconds",
                                "Age of the oldest job that is due but not yet claimed.",
                                value=oldest_overdue_seconds(rows))
        yield CounterMetricFamily("delayq_cancelled", "Jobs cancelled before promotion.",
                                  value=cancelled)


def oldest_overdue_seconds(rows: list[dict[str, Any]]) -> float:
    """How long the oldest due-but-unclaimed job has waited (0 when none)."""
    ages = [(row["now_ms"] - row["next_due_ms"]) / 1000 for row in rows
            if row["next_due_ms"] is not None and row["next_due_ms"] <= row["now_ms"]]
    return max(ages, default=0.0)
