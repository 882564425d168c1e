"""The ``delayq_*`` settings: declared once here, read from ``app.conf`` once per app.

This is the only module that reads ``app.conf``. Django projects using Celery's
``namespace="CELERY"`` write them as ``CELERY_DELAYQ_*``. The configuration reference in
the docs is generated from :data:`SETTINGS`.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

from . import pausing, ratelimit
from .connection import (
    CLUSTER_SUFFIX,
    KOMBU_SOCKET,
    SECRET_NAME,
    SENTINEL_OPTIONS,
    SENTINEL_SCHEME,
    check_readable,
    check_settings,
    holds_password,
    redis_py_url,
    url_list,
)
from .connection import redact as redact
from .errors import ConfigurationError, InvalidOption


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
    Setting("prefix", "delayq", str, "Prefix of every Redis key the store uses."),
    Setting("shards", 8, int,
            "Number of shards (each a set of keys in one cluster slot). Fixed once data exists."),
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
            "Approximate cap on each shard's journal stream; 0 turns the journal off."),
    Setting("worker_events", True, bool,
            "Workers append started/succeeded/failed journal events for delayed tasks."),
    Setting("redis_socket_timeout", 5.0, float,
            "Socket timeout of store connections, seconds; also how long a carrier waits for "
            "the broker's reply where broker_transport_options set no socket_timeout / "
            "read_timeout."),
    Setting("redis_retries", 3, int,
            "Retries with exponential backoff before a store call raises StoreUnavailable."),
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
            "ssl_certfile, ssl_keyfile, ...) or True. Default: broker_use_ssl when the store "
            "is on the broker URL."),
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

#: Broker URL schemes a store can share (kombu's Redis and Redis Sentinel transports).
_REDIS_SCHEMES = ("redis", "rediss", "unix", "sentinel", KOMBU_SOCKET)


#: Deepest ``delayq_max_nesting``: Python decodes ~990 levels, carriers and workers need room.
MAX_NESTING = 500
#: Longest ``delayq_handoff_lead``: a tenth of kombu's default Redis visibility_timeout.
MAX_HANDOFF_LEAD = 360.0
#: Largest ``delayq_claim_batch``: one claim of 10,000 jobs held Redis 59 ms here (50,000
#: 286 ms), and every producer, carrier and worker on it waits meanwhile.
MAX_CLAIM_BATCH = 10_000
#: Longest ``delayq_max_delay``: 100 years.
MAX_DELAY = 100 * 365.25 * 24 * 3600


@dataclass(frozen=True)
class DelayQConfig:
    """Every ``delayq_*`` setting of one app, resolved and validated."""

    redis_url: str
    prefix: str
    shards: int
    max_payload_bytes: int
    max_delay: float
    max_id_length: int
    max_nesting: int
    countdown_threshold: float
    route_send_task: bool
    direct_promotion: bool
    claim_batch: int
    handoff_lead: float
    lease_seconds: float
    shard_lease_seconds: float
    idle_timeout: float
    journal_maxlen: int
    worker_events: bool
    redis_socket_timeout: float
    redis_retries: int
    redis_ssl: TlsOptions | None
    redis_transport_options: dict[str, Any]
    max_memory_fraction: float
    rate_limits: dict[str, str]
    http_retry_schedule: SecondsList
    http_allowed_hosts: HostList
    http_timeout: float
    #: Celery's task_default_queue: the queue of a job whose envelope names none.
    default_queue: str = "celery"
    redis_password: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        """Every setting, with its secrets shown as ``***`` (error reporters such as Sentry
        and Django's debug page print a frame's locals by their repr)."""
        shown = ", ".join(f"{f.name}={_masked(getattr(self, f.name))!r}" for f in fields(self)
                          if f.repr)
        return f"{type(self).__name__}({shown})"

    @classmethod
    def from_app(cls, app) -> DelayQConfig:
        conf = app.conf
        values: dict[str, Any] = {}
        for setting in SETTINGS:
            raw = conf.get(f"delayq_{setting.name}")
            if raw is None:  # unset, or set to None: the default
                raw = setting.default
            values[setting.name] = _coerce(setting, raw)
        if not values["redis_url"]:
            _connect_as_broker(app, values)
        check_readable(values["redis_url"])
        values["redis_url"] = redis_py_url(values["redis_url"])
        config = cls(**values, default_queue=conf.task_default_queue)
        config.validate()
        check_handoff_lead(app, config.handoff_lead)
        return config

    def validate(self) -> None:
        check_settings(self)
        check_claim_batch(self.claim_batch)
        if not 1 <= self.max_nesting <= MAX_NESTING:
            raise ConfigurationError(
                f"delayq_max_nesting must be between 1 and {MAX_NESTING} (deeper data cannot "
                f"be decoded safely by every carrier and worker); got {self.max_nesting}")
        if self.max_delay > MAX_DELAY:
            raise ConfigurationError(
                f"delayq_max_delay must be at most {MAX_DELAY:g} s (100 years), so every due "
                f"time is a date a reader can show; got {self.max_delay:g}")
        for name in ("shards", "max_payload_bytes", "max_id_length"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"delayq_{name} must be at least 1")
        for name in ("max_delay", "lease_seconds", "shard_lease_seconds", "idle_timeout",
                     "redis_socket_timeout", "http_timeout"):
            check_positive(name, getattr(self, name))
        if not 0 <= self.countdown_threshold < math.inf:  # (NaN too)
            raise ConfigurationError("delayq_countdown_threshold must be a number of seconds "
                                     f">= 0; got {self.countdown_threshold}")
        if not 0 < self.max_memory_fraction <= 1:
            raise ConfigurationError("delayq_max_memory_fraction must be in (0, 1], e.g. 0.9")
        for queue, rate in self.rate_limits.items():
            try:
                pausing.field(None, queue)
                ratelimit.parse(rate, f"delayq_rate_limits[{queue!r}]")
            except InvalidOption as exc:
                raise ConfigurationError(str(exc)) from None
        if any(not 0 <= delay <= self.max_delay for delay in self.http_retry_schedule):
            raise ConfigurationError(
                "delayq_http_retry_schedule must hold delays between 0 and delayq_max_delay "
                f"seconds; got {list(self.http_retry_schedule)}")
        for entry in self.http_allowed_hosts:
            try:
                HostList.split(entry)
            except ValueError as exc:
                raise ConfigurationError(
                    f"delayq_http_allowed_hosts entry {entry!r} is invalid: {exc}; accepted "
                    f"forms: {HostList.FORMS}") from None

    @property
    def cluster(self) -> bool:
        """True when ``redis_url`` names a Redis Cluster."""
        return urlsplit(self.redis_url).scheme.endswith(CLUSTER_SUFFIX)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def password_shown(app) -> bool:
    """True when ``delayq_redis_url`` holds a password that Celery's ``celery report`` and
    ``celery inspect conf`` (and Django's error pages) print: they hide only settings named
    like *PASS*, *KEY*, *SECRET* or *TOKEN*, and the broker URL (the store's default)."""
    url = app.conf.get("delayq_redis_url")
    return isinstance(url, str) and holds_password(url)


#: Settings of seconds that become whole milliseconds (a lease of 0 ms ends as it begins).
_MILLISECONDS = ("lease_seconds", "shard_lease_seconds")


def check_positive(name: str, value: float, option: str = "") -> float:
    """``value`` when it is a number of seconds above 0 and at most 100 years (at least
    1 ms for a lease), else :class:`ConfigurationError` naming the setting
    ``delayq_<name>`` (and the carrier's ``option`` that set it)."""
    given = f" (the carrier's {option})" if option else ""
    if not 0 < value <= MAX_DELAY:  # (NaN and infinity too)
        raise ConfigurationError(f"delayq_{name}{given} must be greater than 0 and at most "
                                 f"{MAX_DELAY:g} s (100 years); got {value}")
    if name in _MILLISECONDS and value < 0.001:
        raise ConfigurationError(f"delayq_{name}{given} must be at least 0.001 s (1 ms); "
                                 f"got {value}")
    return value


def check_claim_batch(batch: int) -> int:
    """``batch`` when it is a claim batch Redis runs in one short script call, else
    :class:`ConfigurationError`."""
    if not 1 <= batch <= MAX_CLAIM_BATCH:
        raise ConfigurationError(
            f"delayq_claim_batch (the carrier's --batch) must be between 1 and "
            f"{MAX_CLAIM_BATCH:,}: one claim script call holds Redis ~6 us per job, and every "
            f"producer, carrier and worker on it waits meanwhile; got {batch}")
    return batch


def check_task_protocol(app) -> None:
    """:class:`ConfigurationError` unless ``app`` sends Celery's message protocol 2, the one
    the store keeps calls in and the carrier publishes (its default since Celery 4.0)."""
    protocol = app.conf.task_protocol
    if protocol != 2:
        raise ConfigurationError(
            f"celery-delayq stores and publishes calls in Celery's message protocol 2; this "
            f"app sets task_protocol={protocol!r}. Remove that setting (2 is Celery's "
            "default) or call these tasks without a delay")


def check_handoff_lead(app, seconds: float) -> float:
    """``seconds`` when it is a hand-off lead a worker can hold safely, else
    :class:`ConfigurationError`: a message waits that long unacknowledged in a worker."""
    if not 0 <= seconds <= MAX_HANDOFF_LEAD:
        raise ConfigurationError(
            f"delayq_handoff_lead must be between 0 and {MAX_HANDOFF_LEAD:g} seconds (a "
            "message waits that long in a worker, unacknowledged: well below the broker's "
            f"visibility_timeout); got {seconds:g}")
    visibility = (app.conf.broker_transport_options or {}).get("visibility_timeout")
    if visibility is not None and seconds * 2 > float(visibility):
        raise ConfigurationError(
            f"delayq_handoff_lead ({seconds:g} s) must be at most half the broker's "
            f"visibility_timeout ({visibility} s): a message held longer unacknowledged is "
            "delivered again. Lower the lead or raise the timeout")
    return seconds


def _masked(value: Any) -> Any:
    """``value`` with a URL's passwords, and the values of options named as secrets (in
    mappings, at any depth), shown as ``***``."""
    if isinstance(value, str):
        return redact(value) if "://" in value else value
    if isinstance(value, dict):
        return {name: "***" if isinstance(name, str) and SECRET_NAME.search(name)
                else _masked(item) for name, item in value.items()}
    return value


def _coerce(setting: Setting, raw: Any) -> Any:
    if raw is None:
        return None
    if setting.type is bool and isinstance(raw, str):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if setting.type is int and (isinstance(raw, bool) or (
            isinstance(raw, float) and not raw.is_integer())):
        raise ConfigurationError(f"delayq_{setting.name} must be a whole number, got {raw!r}")
    try:
        return setting.type(raw)
    except (TypeError, ValueError) as exc:
        # a mapping's text (an environment variable, Spark's --set) may hold a password
        got = f"a {type(raw).__name__}" if issubclass(setting.type, dict) else repr(raw)
        raise ConfigurationError(
            f"delayq_{setting.name} must be {setting.type.__name__}, got {got}") from exc


def _connect_as_broker(app, values: dict[str, Any]) -> None:
    """A store on the broker URL connects as the broker does: its URL, ``broker_use_ssl``
    and the Sentinel part of ``broker_transport_options``, unless set for the store."""
    values["redis_url"] = _broker_redis_url(app)
    if values["redis_ssl"] is None and app.conf.broker_use_ssl:
        values["redis_ssl"] = TlsOptions(app.conf.broker_use_ssl)
    if not values["redis_transport_options"]:
        transport = app.conf.broker_transport_options or {}
        values["redis_transport_options"] = {
            name: transport[name] for name in SENTINEL_OPTIONS if name in transport}


def _broker_redis_url(app) -> str:
    """The broker's URL as the store's: one Redis server, or the Sentinels of one master."""
    broker = app.conf.broker_url or ""
    urls = [str(url) for url in broker] if isinstance(broker, (list, tuple)) else url_list(
        broker)
    schemes = {urlsplit(url).scheme for url in urls}
    if schemes == {SENTINEL_SCHEME}:  # a list of Sentinels is one list, whichever form
        return ";".join(urls)
    if len(urls) > 1 and schemes <= set(_REDIS_SCHEMES):
        raise ConfigurationError(
            f"the broker URL lists {len(urls)} Redis servers ({redact(urls)}): kombu moves "
            "to the next one when one fails, but the delay store must stay on one server "
            "(each would hold a store of its own). Set delayq_redis_url to the one that "
            "holds it (CELERY_DELAYQ_REDIS_URL in Django settings)")
    if urls and urlsplit(urls[0]).scheme in _REDIS_SCHEMES:
        return urls[0]
    raise ConfigurationError(
        "celery-delayq needs a Redis URL: set app.conf.delayq_redis_url "
        "(or CELERY_DELAYQ_REDIS_URL in Django settings) to e.g. redis://localhost:6379/0, "
        "or use a Redis broker; on the command line, name your app: celery -A proj delayq ..."
    )
