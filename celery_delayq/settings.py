"""The ``delayq_*`` settings, declared: name, default, type and what each does.

:mod:`celery_delayq.conf` reads them from ``app.conf``; the ``celery delayq`` commands'
help shows their defaults, and the configuration reference in the docs is generated from
:data:`SETTINGS`. This module imports no Redis client: every ``celery`` process loads the
command group.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    type: type
    doc: str


class TlsOptions(dict):
    """TLS options of store connections: redis-py's ``ssl_*`` options, or True for TLS
    with redis-py's defaults (as ``broker_use_ssl`` takes them for a Redis broker)."""

    def __init__(self, raw: Any = ()) -> None:
        super().__init__({} if raw is True else raw)


SETTINGS: tuple[Setting, ...] = (
    Setting("redis_url", None, str,
            "Redis URL of the delay store. Default: the broker URL when the broker is one "
            "Redis server (or the Sentinels of one master); a failover list of Redis "
            "brokers asks for it."),
    Setting("redis_password", None, str,
            "Password of the store's Redis user (with Sentinel, of the master), kept out of "
            "delayq_redis_url: `celery report`, `celery inspect conf` and Django's error "
            "pages hide settings named like this one, and the broker URL, but print "
            "delayq_redis_url as it is. Default: what the URL says."),
    Setting("prefix", "delayq", str,
            "Prefix of every Redis key the store uses (on a Redis Cluster, without an empty "
            "hash tag '{}')."),
    Setting("shards", 8, int,
            "Number of shards (each a set of keys in one cluster slot), 1 to 1,024. Fixed once "
            "data exists."),
    Setting("max_payload_bytes", 256 * 1024, int,
            "Largest stored envelope (task name, arguments, options) in bytes."),
    Setting("max_delay", 366 * 24 * 3600.0, float, "Longest accepted delay, in seconds."),
    Setting("max_id_length", 200, int, "Longest accepted job id or business key, in characters."),
    Setting("max_nesting", 64, int,
            "Deepest nesting of lists and objects accepted in a call's arguments and options "
            "(at most 500, so every carrier and worker can decode them)."),
    Setting("countdown_threshold", 0.0, float,
            "DelayedTask.apply_async sends countdown/eta longer than this many seconds through "
            "the store; shorter ones go to the broker as native Celery ETA."),
    Setting("route_send_task", True, bool,
            "app.send_task (plain tasks, unregistered tasks, signatures) sends countdown/eta "
            "longer than delayq_countdown_threshold through the store as well."),
    Setting("direct_promotion", False, bool,
            "With the store on the broker's Redis (same server and database), the carrier's "
            "claim script pushes plain jobs (no options, headers or exchange) straight onto "
            "their queue's list: no kombu publish, exactly once. Other jobs go through kombu."),
    Setting("claim_batch", 500, int,
            "Most jobs a carrier claims from one shard per round trip (at most 10,000: one "
            "claim script call holds Redis ~6 us per job)."),
    Setting("handoff_lead", 0.0, float,
            "Seconds before its due time a carrier may hand a job to its queue, with the due "
            "time as the message's eta, so the worker's timer starts it on time (as native "
            "ETA). Such a job can no longer be cancelled, and a worker killed while holding it "
            "gives it back only after the broker's visibility_timeout. 0: at the due time."),
    Setting("lease_seconds", 30.0, float,
            "How long a claimed job may stay unacknowledged before another carrier recovers it."),
    Setting("shard_lease_seconds", 10.0, float,
            "How long a carrier's hold on a shard lasts without renewal; a dead carrier's "
            "shards move to the others within this time."),
    Setting("idle_timeout", 5.0, float,
            "Longest a carrier sleeps without checking Redis, even with nothing due."),
    Setting("journal_maxlen", 100_000, int,
            "Approximate cap on each shard's journal stream (at most 10**15); 0 turns the "
            "journal off."),
    Setting("worker_events", True, bool,
            "Workers append started/succeeded/failed journal events for delayed tasks."),
    Setting("redis_socket_timeout", 5.0, float,
            "Socket timeout of store connections, seconds; also how long a carrier waits for "
            "the broker's reply where broker_transport_options set no socket_timeout / "
            "read_timeout."),
    Setting("redis_retries", 3, int,
            "Retries with exponential backoff before a store call raises StoreUnavailable "
            "(0 to 20)."),
    Setting("max_memory_fraction", 0.9, float,
            "Producers get StoreFull once the store's Redis uses this fraction of its "
            "maxmemory (read about once a second per process, sooner near it), so promotion "
            "keeps room on a shared broker; 1 leaves the limit to Redis itself."),
    Setting("rate_limits", {}, dict,
            "Promotion rate limits per queue applied when a carrier starts, e.g. "
            "{'refunds': '200/s'} (Celery's rate strings: N/s, N/m, N/h). The live limits "
            "live in Redis (`delayq rate-limit`): a carrier sets only those Redis lacks."),
    Setting("redis_ssl", None, TlsOptions,
            "TLS for store connections: redis-py's ssl_* options (ssl_cert_reqs, ssl_ca_certs, "
            "ssl_certfile, ssl_keyfile, ...), or true for redis-py's defaults; false or \"\" "
            "for none beyond what the URL asks (rediss://). Default: broker_use_ssl when the "
            "store is on the broker URL."),
    Setting("redis_transport_options", {}, dict,
            "Options of a sentinel:// store, as broker_transport_options: master_name "
            "(required), sentinel_kwargs (options of the Sentinel connections, e.g. their "
            "password), min_other_sentinels; other keys are ignored. Default: "
            "broker_transport_options when the store is on the broker URL."),
)


class SecondsList(tuple):
    """A tuple of seconds, from a sequence of numbers or a comma-separated string."""

    def __new__(cls, raw: Any) -> SecondsList:
        items = raw.split(",") if isinstance(raw, str) else raw
        return super().__new__(cls, (float(item) for item in items if str(item).strip()))


class HostList(tuple):
    """Lower-case allow-list entries of the HTTP callback, from a sequence or a
    comma-separated string; :meth:`split` reads one (``DelayQConfig.validate`` checks all)."""

    #: What an entry may look like, for error messages.
    FORMS = ("'api.example.com', 'api.example.com:8443', '*.example.com', '*', '*:8443', "
             "'10.0.0.5', '[::1]:8080'")
    _LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")

    def __new__(cls, raw: Any) -> HostList:
        items = raw.split(",") if isinstance(raw, str) else raw
        return super().__new__(cls, (str(item).strip().lower() for item in items
                                     if str(item).strip()))

    @classmethod
    def split(cls, entry: str) -> tuple[str, int | None]:
        """``(host, port)`` of one entry, port None for any; ValueError says what is wrong."""
        if "/" in entry:
            raise ValueError("it is a URL or a path, not a host")
        if entry.startswith("["):
            address, bracket, rest = entry[1:].partition("]")
            if not bracket:
                raise ValueError("'[' is not closed by ']'")
            if rest and not rest.startswith(":"):
                raise ValueError("only ':port' may follow ']'")
            return cls._ipv6(address), cls._port(rest[1:]) if rest else None
        if entry.count(":") > 1:
            return cls._ipv6(entry), None
        name, colon, port = entry.partition(":")
        domain = name.removeprefix("*.")
        if name != "*" and (len(domain) > 253 or not all(
                cls._LABEL.fullmatch(label) for label in domain.split("."))):
            raise ValueError(f"{name!r} is not a host name, an IPv4 address, '*', or '*.' "
                             "and a domain")
        return name, cls._port(port) if colon else None

    @staticmethod
    def _ipv6(text: str) -> str:
        try:
            return ipaddress.IPv6Address(text).compressed
        except ValueError:
            raise ValueError(f"{text!r} is not an IPv6 address") from None

    @staticmethod
    def _port(text: str) -> int:
        if text.isascii() and text.isdigit() and 1 <= int(text) <= 65535:
            return int(text)
        raise ValueError(f"the port {text!r} is not a number from 1 to 65535")


# The built-in HTTP callback task (celery_delayq.http).
SETTINGS += (
    Setting("http_retry_schedule", SecondsList((10, 60, 300, 1800, 7200)), SecondsList,
            "Seconds between attempts of celery_delayq.http_callback after a failure; when "
            "they are used up the call is dead-lettered."),
    Setting("http_allowed_hosts", HostList(()), HostList,
            "Hosts celery_delayq.http_callback may call ('api.example.com', "
            "'*.example.com', 'host:port', or '*' for any); empty refuses every URL."),
    Setting("http_timeout", 10.0, float,
            "Default deadline in seconds of each celery_delayq.http_callback attempt: "
            "connecting, sending and reading the whole answer."),
)
