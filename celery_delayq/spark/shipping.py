"""The part of a Celery app that travels to Spark executors: plain config, no task code.

``ship(app, task)`` reads what envelope building needs (routing, queues, serializer,
``delayq_*`` settings) into a dict of plain values; ``bare_app(shipped)`` rebuilds a
task-less Celery app from it on an executor, once per Python worker process.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from celery import Celery
from kombu import Exchange, Queue

from ..broker import global_keyprefix
from ..conf import DelayQConfig

logger = logging.getLogger("celery_delayq.spark")

# Settings envelope.template and Celery's router read, besides task_default_* / task_queue_*
# and kombu's global_keyprefix.
_NAMED = ("broker_url", "task_serializer", "task_create_missing_queues", "task_protocol",
          "task_inherit_parent_priority")
_PREFIXES = ("task_default_", "task_queue_")
_apps: dict[str, Celery] = {}


def ship(app: Celery, task: str) -> dict[str, Any]:
    """The plain-data config an executor needs to build envelopes of ``task`` for ``app``."""
    from celery.app.defaults import DEFAULTS

    conf: dict[str, Any] = {}
    for name in sorted(DEFAULTS):
        if name in _NAMED or name.startswith(_PREFIXES):
            value = app.conf.get(name)
            if plain(value):
                conf[name] = value
    conf["task_queues"] = _queues(app.conf.get("task_queues"))
    if global_keyprefix(app):  # (the only broker transport option: others hold secrets)
        conf["broker_transport_options"] = {"global_keyprefix": global_keyprefix(app)}
    routes = app.conf.get("task_routes")
    if routes is None or _plain_routes(routes):
        conf["task_routes"] = routes
    else:
        conf["task_routes"] = {task: _resolved_route(app, task)}
        logger.warning(
            "task_routes of %s is not plain data (a function, class path or regex); it was "
            "evaluated once on the driver for %s without arguments. Routes that depend on "
            "arguments need a per-row queue_col.", app.main, task)
    shipped = {"conf": conf, "delayq": DelayQConfig.from_app(app).as_dict()}
    json.dumps(shipped)  # everything shipped is plain data; fail on the driver if not
    return shipped


def bare_app(shipped: dict[str, Any]) -> Celery:
    """A Celery app without tasks, configured like the shipped one (cached per process)."""
    cache_key = json.dumps(shipped, sort_keys=True)
    app = _apps.get(cache_key)
    if app is None:
        conf = dict(shipped["conf"])
        queues = conf.pop("task_queues")
        app = Celery("celery_delayq.spark", set_as_current=False)
        app.conf.update(conf)
        if queues is not None:
            app.conf.task_queues = [_queue(q) for q in queues]
        _apps[cache_key] = app
    return app


def config(shipped: dict[str, Any]) -> DelayQConfig:
    """The shipped ``delayq_*`` settings."""
    return DelayQConfig(**shipped["delayq"])


def plain(value: Any) -> bool:
    """True when ``value`` is JSON data."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _plain_routes(routes: Any) -> bool:
    """Dicts of glob/name -> queue name or option dict, alone or in a list: no code."""
    maps = routes if isinstance(routes, (list, tuple)) else [routes]
    return all(isinstance(m, dict) and plain(m) for m in maps)


def _resolved_route(app: Celery, task: str) -> dict[str, Any]:
    routed = app.amqp.router.route({}, task, (), {}, None)
    route: dict[str, Any] = {}
    queue = routed.get("queue")
    if queue is not None:
        route["queue"] = getattr(queue, "name", queue)
    for name in ("exchange", "routing_key"):
        value = routed.get(name)
        if value is not None:
            route[name] = getattr(value, "name", value)
    return route


def _queues(queues: Any) -> list[dict[str, Any]] | None:
    if queues is None:
        return None
    if isinstance(queues, dict):
        queues = [Queue(name, **(opts or {})) for name, opts in queues.items()]
    shipped = []
    for queue in queues:
        exchange = queue.exchange
        shipped.append({
            "name": queue.name,
            "exchange": None if exchange is None else exchange.name,
            "exchange_type": None if exchange is None else exchange.type,
            "routing_key": queue.routing_key,
            "queue_arguments": queue.queue_arguments,
        })
    return shipped


def _queue(data: dict[str, Any]) -> Queue:
    exchange = None
    if data["exchange"] is not None:
        exchange = Exchange(data["exchange"], type=data["exchange_type"] or "direct")
    return Queue(data["name"], exchange=exchange, routing_key=data["routing_key"],
                 queue_arguments=data["queue_arguments"])
