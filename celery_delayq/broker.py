"""The carrier's connections to the broker: the app's, never waiting for ever on a reply.

kombu waits on a broker connection without limit unless its transport options say how
long (Redis: ``socket_timeout``; py-amqp: ``read_timeout``). A broker that keeps the
connection open and stops answering (a partition that drops packets, a hung proxy) would
hold the carrier there for good: no promotion, nothing logged, its claimed jobs' leases
running out, a stop request never seen. The carrier's connections wait at most the store's
``delayq_redis_socket_timeout`` for each reply instead, unless ``broker_transport_options``
set a wait of their own.
"""

from __future__ import annotations

from typing import Any

from .connection import redact
from .errors import ConfigurationError

#: kombu's driver type -> the transport options that bound a wait on the broker.
_WAITS = {
    "redis": ("socket_timeout", "socket_connect_timeout"),
    "amqp": ("read_timeout", "write_timeout"),
}


def global_keyprefix(app) -> str:
    """What kombu's Redis transport puts before each of its keys (``global_keyprefix`` of
    ``broker_transport_options``), "" for none."""
    return (app.conf.broker_transport_options or {}).get("global_keyprefix") or ""


def connection(app, timeout: float) -> Any:
    """A new connection to ``app``'s broker (``connection_for_write``), not yet open, that
    waits at most ``timeout`` seconds for the broker where its transport options set no
    wait."""
    plain = app.connection_for_write()
    given = app.conf.broker_transport_options or {}
    waits = {name: timeout for name in _WAITS.get(plain.transport.driver_type, ())
             if given.get(name) is None}
    if not waits:
        return plain
    plain.release()
    return app.connection_for_write(transport_options=waits)


def channel(connection: Any) -> Any:
    """The connection's default channel, opened: :class:`ConfigurationError` when kombu
    refuses the broker's settings (its ``ValueError``: a Sentinel URL without
    ``master_name``, a database that is not a number), which Celery's workers cannot use
    either; a broker that does not answer raises as kombu raises it."""
    try:
        return connection.default_channel
    except ValueError as exc:
        raise ConfigurationError(
            f"kombu cannot use the broker at {redact(connection.as_uri())}: {exc}. Celery's "
            "workers cannot either: fix broker_url or broker_transport_options") from exc
