"""The ``delayq_*`` settings (declared in :mod:`celery_delayq.settings`), read from
``app.conf`` once per app.

This is the only module that reads ``app.conf``. Django projects using Celery's
``namespace="CELERY"`` write them as ``CELERY_DELAYQ_*``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
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
from .errors import ConfigurationError, InvalidOption, UnsupportedMessage
from .settings import SETTINGS, HostList, SecondsList, Setting, TlsOptions

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
#: Most ``delayq_shards``: each costs every carrier a claim call per round and ``stats`` a
#: read, and the store's record keeps the first count given (80,000 by a typo made
#: ``stats`` run for minutes).
MAX_SHARDS = 1024
#: Most ``delayq_redis_retries``: each waits up to the socket timeout and a backoff of up to
#: 1 s, so 20 already hold a call for minutes against a Redis that is away.
MAX_REDIS_RETRIES = 20
#: Longest ``delayq_journal_maxlen``: Lua prints larger numbers in exponent form
#: (``1e+17``), which XADD refuses after the script's writes.
MAX_JOURNAL_MAXLEN = 10**15


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
        """The app's settings, checked: :class:`ConfigurationError` names a refused one as
        the app's settings write it (``CELERY_DELAYQ_SHARDS`` in a Django project)."""
        try:
            return cls._read(app)
        except ConfigurationError as exc:
            if not app.namespace:
                raise
            raise ConfigurationError(as_written(str(exc), app.namespace)) from None

    @classmethod
    def _read(cls, app) -> DelayQConfig:
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
        if not 0 <= self.journal_maxlen <= MAX_JOURNAL_MAXLEN:
            raise ConfigurationError(
                f"delayq_journal_maxlen must be 0 (no journal) to {MAX_JOURNAL_MAXLEN:,} "
                f"entries per shard (the scripts pass it to XADD as a Lua number); got "
                f"{self.journal_maxlen:,}")
        tag = self.prefix.find("{")
        if self.cluster and tag >= 0 and self.prefix.startswith("}", tag + 1):
            raise ConfigurationError(
                f"delayq_prefix {self.prefix!r} holds an empty hash tag ({{}}): on a Redis "
                "Cluster every key of the store would be hashed whole, so one shard's keys "
                "would fall in different slots. Choose a prefix without '{}'")
        if self.shards > MAX_SHARDS:
            raise ConfigurationError(
                f"delayq_shards must be at most {MAX_SHARDS:,} (each shard costs every carrier "
                f"a claim call per round, and the store keeps the first count); got "
                f"{self.shards:,}")
        if not 0 <= self.redis_retries <= MAX_REDIS_RETRIES:
            raise ConfigurationError(
                f"delayq_redis_retries must be between 0 and {MAX_REDIS_RETRIES} (each waits "
                f"up to delayq_redis_socket_timeout and a backoff of up to 1 s); got "
                f"{self.redis_retries}")
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


#: What a carrier and a worker log when :func:`password_shown`.
PASSWORD_SHOWN = ("delayq_redis_url holds a password, which `celery report` and `celery inspect "
                  "conf` print as it is: set delayq_redis_password "
                  "(CELERY_DELAYQ_REDIS_PASSWORD in Django settings) instead")


def as_written(message: str, namespace: str) -> str:
    """``message`` with each ``delayq_*`` setting it names also named as an app that reads
    its settings with ``namespace`` writes it (Django's ``CELERY_``), once."""
    names = dict.fromkeys(re.findall(r"\bdelayq_[a-z_]*[a-z]", message))
    missing = [written for written in (f"{namespace}_{name}".upper() for name in names)
               if written not in message]
    if not missing:
        return message
    return f"{message} ({', '.join(missing)} in this app's settings)"


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
    """:class:`UnsupportedMessage` unless ``app`` sends Celery's message protocol 2, the one
    the store keeps calls in and the carrier publishes (its default since Celery 4.0)."""
    protocol = app.conf.task_protocol
    if protocol != 2:
        raise UnsupportedMessage(
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


#: What a switch (a bool setting) may be given as: a word read from an environment variable
#: or a command line, or a bool (or 1 / 0). Anything else is a typo, not False.
_SWITCH: dict[Any, bool] = {
    **dict.fromkeys(("1", "true", "yes", "on", True), True),
    **dict.fromkeys(("0", "false", "no", "off", False), False)}


def _switch(raw: Any) -> bool | None:
    """``raw`` as a switch (true / false, yes / no, on / off, 1 / 0), else None."""
    word = raw.strip().lower() if isinstance(raw, str) else raw
    if isinstance(word, (str, int)) and word in _SWITCH:  # (1 == True, 0 == False)
        return _SWITCH[word]
    return None


def _tls(raw: Any) -> TlsOptions | None:
    """``delayq_redis_ssl``: redis-py's ``ssl_*`` options, a switch, or "" (as an unset
    environment variable reads) for off."""
    if isinstance(raw, Mapping):
        return TlsOptions(raw)
    on = False if raw == "" else _switch(raw)
    if on is None:
        raise ConfigurationError(
            "delayq_redis_ssl must be true or false, or a mapping of redis-py's ssl_* options "
            f"(ssl_ca_certs, ssl_certfile, ssl_keyfile, ssl_cert_reqs, ...), got a "
            f"{type(raw).__name__}")  # (text that is not a switch may hold a password)
    return TlsOptions() if on else None


def _coerce(setting: Setting, raw: Any) -> Any:
    if raw is None:
        return None
    if setting.type is bool:
        on = _switch(raw)
        if on is None:
            raise ConfigurationError(f"delayq_{setting.name} must be true or false (or yes / "
                                     f"no, on / off, 1 / 0), got {raw!r}")
        return on
    if setting.type is TlsOptions:
        return _tls(raw)
    if setting.type is int and (isinstance(raw, bool) or (
            isinstance(raw, float) and not raw.is_integer())):
        raise ConfigurationError(f"delayq_{setting.name} must be a whole number, got {raw!r}")
    if setting.type is float and isinstance(raw, bool):
        raise ConfigurationError(f"delayq_{setting.name} must be a number, got {raw!r}")
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
