"""Direct promotion: the broker queues the claim script pushes plain jobs to itself.

With ``delayq_direct_promotion`` the carrier first makes sure the broker is the store's
Redis server and database, and one broker rather than a failover list (else a
:class:`ConfigurationError` that says how to fix it),
then hands ``claim_due`` the broker list of every queue in ``app.amqp.queues`` (kombu's
Redis transport names it ``global_keyprefix`` + queue; queues with ``expires`` are left out)
and the delivery mode of each. A queue the carrier meets later through kombu (e.g. created
by ``task_create_missing_queues``) is routed directly from then on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import redis
from redis.cluster import RedisCluster

from . import broker
from .connection import SENTINEL_SCHEME, redact
from .envelope import ORIGIN
from .errors import ConfigurationError
from .keys import broker_queue
from .store import DirectRoutes, Store

logger = logging.getLogger("celery_delayq.carrier")

#: A queue's kombu ``Queue`` and delivery mode by name (``Publisher.queue``).
QueueLookup = Callable[[str], tuple[Any, int]]


class DirectRouter:
    """The broker queues a carrier's claims push to (``routes``), once the broker checked."""

    def __init__(self, app, store: Store, queue: QueueLookup) -> None:
        self.app = app
        self.store = store
        self._queue = queue
        self.routes: DirectRoutes | None = None  # the queues the claim script pushes to
        self._prefix: str | None = None  # set once the broker is known to be the store
        self._considered: set[str] = set()  # queue names looked at for direct promotion

    @property
    def checked(self) -> bool:
        """True once :meth:`check_broker` found the broker to be the store."""
        return self._prefix is not None

    def check_broker(self) -> None:
        """Make sure the broker is the store's Redis, then route its queues directly."""
        with broker.connection(self.app, self.store.config.redis_socket_timeout) as connection:
            store = self.store.client  # not a cluster: refused with direct promotion
            same = (connection.transport.driver_type == "redis"
                    and isinstance(store, redis.Redis)
                    and _same_database(broker.channel(connection).client, store))
            failover = _failover_list(connection.alt)
        if failover:
            raise ConfigurationError(
                f"delayq_direct_promotion cannot follow a failover list of brokers "
                f"({redact(failover)}): kombu moves to the next one when one fails, while "
                "the claim script pushes to the store's server. List one broker (a Sentinel "
                "URL follows failovers) or turn delayq_direct_promotion off.")
        if not same:
            raise ConfigurationError(
                "delayq_direct_promotion needs the delay store on the broker's Redis server "
                f"and database; the broker is {redact(self.app.conf.broker_url or '')}, the "
                f"store {redact(self.store.config.redis_url)}. Point delayq_redis_url at the "
                "broker or turn delayq_direct_promotion off.")
        self._prefix = broker.global_keyprefix(self.app)
        self._route(list(self.app.amqp.queues))

    def meet(self, names: Iterable[str]) -> None:
        """Route the queues among ``names`` not looked at yet (once the broker is checked)."""
        if self._prefix is None:
            return
        new = [name for name in names if name not in self._considered]
        if new:
            self._route(new)

    def _route(self, names: list[str]) -> None:
        """Let the claim script push to these queues too (all but those with x-expires, and
        those whose list would be a key of the store: the carrier dead-letters their jobs)."""
        assert self._prefix is not None
        self._considered.update(names)
        routed = [name for name, _ in self.routes.queues] if self.routes else []
        routed += [name for name in names
                   if self.store.keys.queue_problem(name, self._prefix) is None
                   and not self._queue(name)[0].expires]
        self.routes = DirectRoutes(
            lists=[broker_queue(self._prefix, name) for name in routed],
            queues=[(name, self._queue(name)[1]) for name in routed],
            origin=ORIGIN, repr_max=self.app.amqp.argsrepr_maxsize)
        logger.info("direct promotion into %s", ", ".join(routed))


def _failover_list(urls: list) -> str:
    """The broker URLs kombu fails over between, joined; "" for one broker or Sentinels
    (whose list names one master)."""
    texts = [url for url in urls if isinstance(url, str)]
    if len(urls) < 2 or all(url.startswith(f"{SENTINEL_SCHEME}://") for url in texts):
        return ""
    return ";".join(texts)


def broker_is_store_server(app, store: Store) -> bool:
    """True when the broker is the store's Redis server (any database)."""
    with broker.connection(app, store.config.redis_socket_timeout) as connection:
        if connection.transport.driver_type != "redis":
            return False
        return _run_id(broker.channel(connection).client) == _run_id(store.client)


def _run_id(client: redis.Redis | RedisCluster) -> str:
    """The run id of the Redis server a client reaches."""
    return client.info("server")["run_id"]


def _same_database(broker: redis.Redis, store: redis.Redis) -> bool:
    """True when two clients reach the same Redis server (by run id) and database."""
    def where(client: redis.Redis) -> tuple[str, int]:
        return _run_id(client), int(client.connection_pool.connection_kwargs.get("db") or 0)
    return where(broker) == where(store)
