"""The stored form of a delayed task call.

``template`` resolves what ``apply_async`` would resolve at call time (routing through
``task_routes``, parent and root ids, absolute ``expires``), ``Template.call`` adds the
ids and arguments of one call, keeping only what cannot be re-derived; :mod:`message`
rebuilds the Celery message from it at promotion.

The stored text is three lines of compact JSON (which never holds a raw newline)::

    {"t":"shop.close_unpaid_order","y":"order:42"}    the fields below
    [42]                                              args, "" when there are none
    {"reason":"unpaid"}                               kwargs, "" when there are none

Fields of the first line (absent when empty)::

    t task name        i task id (when not the job id)             y business key
    q queue name (absent: task_default_queue)   x exchange   r routing key (when not q)
    o message options (expires, link callbacks, retries, time limits, parent ids, ...)
    h custom headers   p publish properties (priority, delivery_mode, ...)

Arguments sit on lines of their own so promotion can put them into a message body
verbatim, in Python and in the direct promotion script (Lua's cjson would round numbers to
14 digits and turn ``[]`` into ``{}`` if it decoded and re-encoded them).

:mod:`decoding` reads the text back; :class:`~celery_delayq.job.Job` is a stored job as
the API lists it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from functools import cached_property
from typing import Any

from celery.app import task as celery_task
from celery.app.amqp import Queues
from celery.app.routes import MapRoute
from celery.utils.functional import maybe_list
from celery.utils.nodenames import anon_nodename
from kombu import Exchange, Queue
from kombu.common import Broadcast
from kombu.utils.json import JSONEncoder

from .broker import global_keyprefix
from .conf import check_task_protocol
from .decoding import RESERVED_PROPERTIES, decode_fields, decode_json, nesting
from .errors import InvalidOption, PayloadError, UnknownQueue
from .keys import Keyspace, new_job_id, pack_id
from .reading import forbidden, iso_time

#: Headers the carrier adds to every promoted message; a retry carries them back.
HEADER_JOB = "delayq_job"
HEADER_KEY = "delayq_key"
HEADER_SHARD = "delayq_shard"
HEADER_DUE = "delayq_due"
#: The task id ``Task.replace`` handed a job's headers to (``journal.hand_over``): the
#: replacement's part that runs under it, which another task's worker may send.
HEADER_HANDED = "delayq_handed"
DELAYQ_HEADERS = (HEADER_JOB, HEADER_KEY, HEADER_SHARD, HEADER_DUE, HEADER_HANDED)

# apply_async options that only make sense for an immediate publish.
_IGNORED = frozenset({
    "producer", "connection", "publisher", "router", "retry", "retry_policy",
    "add_to_parent", "result_cls", "declare", "countdown", "eta", "route_name",
})
# Options create_task_message takes by name (stored under "o").
_MESSAGE = (
    "expires", "group_id", "group_index", "retries", "chord", "callbacks", "errbacks",
    "time_limit", "soft_time_limit", "root_id", "parent_id", "shadow", "chain",
    "ignore_result", "replaced_task_nesting", "reply_to", "origin", "stamped_headers",
    "argsrepr", "kwargsrepr",
)
#: Of them, what logs and monitoring events show instead of the arguments (Celery's way to
#: keep secrets out of them): text.
REPRS = ("argsrepr", "kwargsrepr")
# Values create_task_message uses when an option is absent (the direct promotion script
# writes them too).
_MESSAGE_DEFAULTS = {"retries": 0, "replaced_task_nesting": 0}
#: What ``send_task`` puts in a message's ``ignore_result`` when the call gives none: null
#: where the worker then takes its task's own setting (Celery 5.7), else false. A call's
#: ``ignore_result`` is stored only where it is not its task's own: a message carries null
#: otherwise (the worker takes its task's; Celery before 5.7 reads the task's alone).
SEND_TASK_IGNORE_RESULT = None if hasattr(celery_task, "get_actual_ignore_result") else False
# kombu's names of the delivery modes a call may give (or an int, as 1 and 2).
_DELIVERY_MODES = (None, "transient", "persistent")
# Routing options consumed by build (never stored as properties).
_ROUTING = frozenset({"queue", "exchange", "routing_key", "exchange_type"})
_JSON = "json"
ORIGIN = anon_nodename()  # the promoting process, as Celery names a producer
# kombu's dumps() builds an encoder per call; these do the same (datetime, UUID,
# Decimal ... as kombu encodes them), compact, built once. NaN and Infinity are refused:
# they are not JSON, and the direct promotion script could not pass them on.
encode_json = JSONEncoder(separators=(",", ":"), allow_nan=False).encode
#: One value as canonical JSON (keys sorted): equal values, equal text. What
#: ``pending(args_contains=...)`` compares a call's argument values by.
canonical_json = JSONEncoder(separators=(",", ":"), sort_keys=True, allow_nan=False).encode
# The escapes of a JSON text.
_ESCAPE = re.compile(r"\\(?:u(d[89a-f][0-9a-f]{2})|.)")


@dataclass(frozen=True)
class Call:
    """A task call resolved and encoded, ready for the store."""

    job_id: str
    task_id: str
    task: str
    key: str | None
    envelope: str
    stored_id: str = ""  # the job id as stored (keys.pack_id); worked out when not given
    drawn: bool = False  # the job id was drawn at random for this call: no job has it yet
    ignored: bool | None = False  # its result is not stored (None: as its task says)
    # the running task whose child it is (send_task's add_to_parent)
    parent: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.stored_id:
            object.__setattr__(self, "stored_id", pack_id(self.job_id))


@dataclass(frozen=True)
class Template:
    """What a call's options resolve to: everything but its arguments and ids."""

    name: str
    task_id: str | None  # fixed by the caller
    job_id: str | None  # carried over in a retried task's headers
    key: str | None
    fixed: dict[str, Any]  # envelope fields q, x, r, o, h, p
    ignored: bool | None = False  # the message's ignore_result (None: the task's own)
    # the running task its calls are children of (send_task's add_to_parent)
    parent: Any = field(default=None, compare=False, repr=False)

    def call(self, args, kwargs, *, job_id: str | None, key: str | None,
             max_payload_bytes: int, max_nesting: int) -> Call:
        """The stored form of one call with these options; raises on bad arguments."""
        args = _check_args(args, kwargs)
        job_id = job_id or self.job_id
        stored_id = ""  # Call packs the job id, unless it is a new task id, packed here
        if self.task_id:
            task_id = self.task_id
        elif job_id:
            task_id = new_job_id()[0]
        else:
            task_id, stored_id = new_job_id()
        key = key or self.key
        own: dict[str, Any] = {}  # the fields of this call alone
        if job_id and task_id != job_id:
            own["i"] = task_id
        if key:
            own["y"] = key
        fields = self._fields if not own else _encode_fields(
            {"t": self.name, **own, **self.fixed}, self.name)
        encoded = _join(fields, args, kwargs, self.name)
        size = len(encoded)  # ASCII: non-ASCII characters are escaped
        if size > max_payload_bytes:
            raise PayloadError(
                f"{self.name} call is {size} bytes encoded, over delayq_max_payload_bytes="
                f"{max_payload_bytes}; store large data elsewhere and pass a reference"
            )
        _check_readable(encoded, self.name, max_nesting)
        return Call(job_id=job_id or task_id, task_id=task_id, task=self.name, key=key,
                    envelope=encoded, stored_id=stored_id, drawn=bool(stored_id),
                    ignored=self.ignored, parent=self.parent)

    @cached_property
    def _fields(self) -> str:
        """The first line of every call that adds no fields of its own, encoded once."""
        return _encode_fields({"t": self.name, **self.fixed}, self.name)


def _going_on_with(parent, task_id: str | None, headers: dict[str, Any]
                   ) -> tuple[str | None, str | None]:
    """The job and business key a call goes on with, from its headers: when it is the
    running delayed task ``parent``'s own retry (its task id, with its headers: Celery's
    ``retry`` sends them along), or the part of a replacement that ``Task.replace`` handed
    the job to (its task id in ``HEADER_HANDED``; sent by whichever task runs before it);
    else none. Forwarded to other calls (``headers=self.request.headers``), the headers
    named a job that was not theirs, and each such call replaced the one before it."""
    job_id = headers.get(HEADER_JOB)
    if job_id is None or task_id is None:
        return None, None
    request = parent.request if parent is not None else None
    retried = request is not None and task_id == request.id \
        and request.get(HEADER_JOB) == job_id
    if not retried and headers.get(HEADER_HANDED) != task_id:
        return None, None
    return job_id, headers.get(HEADER_KEY)


def template(app, name: str, options: dict[str, Any], keys: Keyspace, *, task_type=None,
             args=(), kwargs=None) -> Template:
    """Resolve ``apply_async`` options as Celery would at call time; raise on bad ones
    (among them a queue whose broker list would be one of the store's ``keys``).

    ``args``/``kwargs`` matter only to routers in ``task_routes`` that look at them.
    """
    if not isinstance(name, str) or not name:
        raise InvalidOption(f"the task name must be a non-empty string, got {name!r}; pass "
                            "the name the task is registered under, e.g. 'shop.tasks.refund'")
    _check_name(name, "task name")
    check_task_protocol(app)
    parent = app.current_worker_task
    adds_to_parent = options.get("add_to_parent", True)
    options = {k: v for k, v in options.items() if k not in _IGNORED}
    serializer = options.pop("serializer", None) or (
        getattr(task_type, "serializer", None) or app.conf.task_serializer)
    if serializer != _JSON:
        raise PayloadError(
            f"celery-delayq stores task calls as JSON only; {name} uses serializer "
            f"{serializer!r}. Set serializer='json' on the task or task_serializer='json'."
        )
    reserved = RESERVED_PROPERTIES & options.keys()
    if reserved:
        raise PayloadError(f"options {sorted(reserved)} cannot be set: payloads are JSON only")

    headers = dict(options.pop("headers", None) or {})
    task_id = options.pop("task_id", None)
    job_id, key = _going_on_with(parent, task_id, headers)
    for name_ in DELAYQ_HEADERS:
        headers.pop(name_, None)
    if "link" in options:
        options["callbacks"] = maybe_list(options.pop("link"))
    if "link_error" in options:
        options["errbacks"] = maybe_list(options.pop("link_error"))

    ignored = _ignore_result(app, name, task_type, options)  # (routing drops a None)
    _check_route_types(options)  # before Celery's router adds a queue named 5 to the app's
    try:
        router = app.amqp.router
        routed = router.route(options, name, args, kwargs or {}, task_type)
        queue, exchange, routing_key = _resolve_route(app, name, routed, router.queues)
    except KeyError as exc:  # celery's QueueNotFound, or a queue missing from task_queues
        raise UnknownQueue(
            f"unknown queue: {name} routes to a queue that is not in task_queues "
            f"({exc.args[0] if exc.args else exc}); define it there or set "
            "task_create_missing_queues=True") from exc
    for what, part in (("queue", queue), ("exchange", exchange), ("routing_key", routing_key)):
        _check_name(part, what)
    problem = keys.queue_problem(queue, global_keyprefix(app))
    if problem is not None:
        raise InvalidOption(problem)
    message = {k: routed.pop(k) for k in _MESSAGE if k in routed}
    message = {k: v for k, v in message.items()
               if v is not None and v != _MESSAGE_DEFAULTS.get(k)}
    if ignored is not None and ignored != bool(_own_ignore_result(app, name, task_type)):
        message["ignore_result"] = ignored  # else null: the worker takes its task's own
    for name_ in REPRS:
        if not isinstance(message.get(name_, ""), str):
            raise PayloadError(f"{name_} must be a string (what worker logs and monitoring "
                               f"events show instead of the arguments); got "
                               f"{type(message[name_]).__name__}")
    _inherit_parent(app, parent, message, routed)
    if "reply_to" not in message and replies_to_caller(app):
        message["reply_to"] = app.thread_oid  # as send_task sets it
    if "expires" in message:
        message["expires"] = _absolute(message["expires"])
    for stamp in message.get("stamped_headers") or ():
        message[stamp] = routed.pop(stamp, None)
    properties = {k: v for k, v in routed.items() if k not in _ROUTING and v is not None}
    check_properties(properties)

    fixed: dict[str, Any] = {}
    if exchange or routing_key != queue:
        fixed["q"], fixed["x"], fixed["r"] = queue, exchange, routing_key
    elif queue != app.amqp.default_queue.name:
        fixed["q"] = queue
    for short, value in (("o", message), ("h", headers), ("p", properties)):
        if value:
            fixed[short] = value
    return Template(name=name, task_id=task_id, job_id=job_id, key=key, fixed=fixed,
                    ignored=ignored, parent=parent if adds_to_parent else None)


def check_properties(properties: Mapping[str, Any]) -> None:
    """Refuse message properties kombu cannot publish: natively ``apply_async`` fails on
    them at the call; stored, the carrier could never publish the job."""
    mode = properties.get("delivery_mode")
    if type(mode) is not int and mode not in _DELIVERY_MODES:  # (bool is no mode)
        raise InvalidOption(f"delivery_mode must be 1, 2, 'transient' or 'persistent' (kombu's "
                            f"delivery modes); got {mode!r}")
    expiration = properties.get("expiration")
    if expiration is not None and (type(expiration) not in (int, float)
                                   or not _finite(expiration * 1000)):
        raise InvalidOption(f"expiration must be a finite number of seconds (the message's "
                            f"time to live in the broker); got {expiration!r}")
    info = properties.get("delivery_info")
    if info is not None and not isinstance(info, Mapping):
        raise InvalidOption(f"delivery_info must be a mapping (kombu adds the exchange and "
                            f"routing key to it); got {type(info).__name__}")


def _finite(number: float) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an int past a float's range
        return False


def _own_ignore_result(app, name: str, task_type) -> bool | None:
    """The task's own ``ignore_result``; None when this process does not know the task."""
    task = task_type or app._tasks.get(name)  # as send_task looks: the app not finalized
    return None if task is None else bool(task.ignore_result)


def _ignore_result(app, name: str, task_type, options: dict[str, Any]) -> bool | None:
    """The call's ``ignore_result``, taken out of ``options``: given (``Task.apply_async``
    always gives it, ``send_task`` its own default, :data:`SEND_TASK_IGNORE_RESULT`), else
    the task's own."""
    if "ignore_result" in options:
        return options.pop("ignore_result")
    return bool(_own_ignore_result(app, name, task_type))


#: What each routing option of a call may be, and how to say it.
_ROUTE_TYPES: dict[str, tuple[type | tuple[type, ...], str]] = {
    "queue": ((str, Queue), "a queue name (a string) or a kombu Queue"),
    "exchange": ((str, Exchange), "an exchange name (a string) or a kombu Exchange"),
    "routing_key": (str, "a string"),
}


def _check_route_types(options: Mapping[str, Any]) -> None:
    """Refuse a ``queue``, ``exchange`` or ``routing_key`` option of the wrong type (None is
    the default route)."""
    for what, (types, said) in _ROUTE_TYPES.items():
        value = options.get(what)
        if value is not None and not isinstance(value, types):
            raise InvalidOption(f"{what} must be {said}, got {type(value).__name__}")


def _check_name(value: object, what: str) -> None:
    """Refuse a task name or a route's name (queue, exchange, routing key) that holds a
    character of :data:`reading.FORBIDDEN`: ``delayq ls`` and logs show them."""
    problem = forbidden(value, what) if isinstance(value, str) else None
    if problem is not None:
        raise InvalidOption(problem)


class Templates:
    """One app's templates of calls made outside a task, by task and options.

    Resolved once per task and distinct options, as Celery resolves routing once: its
    router and queues are fixed at first use. Calls whose template could differ from one
    call to the next are resolved each time: inside a task (parent and root ids), with a
    relative ``expires``, with options that are not plain values (headers, links), or when
    ``task_routes`` has routers, which may look at the arguments. With the RPC result
    backend they are kept per calling thread too (its ``reply_to``).
    """

    _MAX = 256  # distinct (task, options) kept; a caller varying task_id per call fills it

    def __init__(self, app, keys: Keyspace) -> None:
        self.app, self.keys = app, keys
        self._found: dict[tuple, Template] = {}

    @cached_property
    def _replies(self) -> bool:
        """Whether a call's template holds its thread's ``reply_to`` (fixed, as the result
        backend is once made)."""
        return replies_to_caller(self.app)

    @cached_property
    def _routers(self) -> bool:
        """Whether ``task_routes`` has routers (fixed, as Celery's router is once made)."""
        return routes_depend_on_arguments(self.app)

    def get(self, name: str, options: dict[str, Any], task_type=None, args=(),
            kwargs=None) -> Template:
        """What ``template`` would answer for this call."""
        key = _template_key(name, options, task_type)
        if key is not None and self._replies:
            key = (*key, self.app.thread_oid)
        if key is None or self._routers or self.app.current_worker_task is not None:
            return template(self.app, name, options, self.keys, task_type=task_type,
                            args=_check_args(args, kwargs), kwargs=kwargs)
        found = self._found.get(key)
        if found is None:
            found = template(self.app, name, options, self.keys, task_type=task_type)
            if len(self._found) >= self._MAX:
                self._found.clear()
            self._found[key] = found
        return found


def _template_key(name: str, options: dict[str, Any], task_type) -> tuple | None:
    """A hashable key of a call's options, or None when one is not a plain value or is a
    relative ``expires``."""
    if options.get("expires") is not None:
        return None
    items = []
    for option, value in options.items():
        if value is not None and not isinstance(value, (str, int, float)):
            return None
        items.append((option, type(value).__name__, value))  # 1, 1.0 and True are equal
    return name, task_type, tuple(sorted(items))


def routes_depend_on_arguments(app) -> bool:
    """True when ``task_routes`` has routers (functions or classes), which may look at a
    call's arguments; a mapping of task names (or patterns) to routes does not."""
    return any(not isinstance(route, MapRoute) for route in app.amqp.router.routes)


def _check_args(args, kwargs) -> list:
    if args is None:
        args = []
    if not isinstance(args, (list, tuple)):
        raise PayloadError(f"task args must be a list or tuple, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise PayloadError(f"task kwargs must be a mapping, got {type(kwargs).__name__}")
    return list(args)


def encode(env: dict[str, Any]) -> str:
    """The stored text of an envelope (see the module docstring); the inverse of
    :func:`decoding.decode`."""
    name = env.get("t")
    fields = _encode_fields({k: v for k, v in env.items() if k not in ("a", "k")}, name)
    return _join(fields, env.get("a"), env.get("k"), name)


#: The body's third element (``embed``): the call's options of these names (envelope.py).
EMBED = ("callbacks", "errbacks", "chain", "chord")


def as_published(call: Call, *, headers: dict[str, Any] | None = None,
                 properties: dict[str, Any] | None = None, embed: dict[str, Any] | None = None,
                 arguments: tuple[Any, Any] | None = None, max_payload_bytes: int,
                 max_nesting: int) -> Call:
    """``call`` as publish signal handlers left its message: its stored ``headers`` and
    ``properties`` (``h``, ``p``) replaced, the body's ``embed`` (:data:`EMBED`) and its
    args and kwargs, each when given. Raises as a call made so would (not JSON, too large,
    too deep, properties kombu cannot publish)."""
    line, args, kwargs = call.envelope.split("\n", 2)
    fields = decode_fields(line)
    for short, given in (("h", headers), ("p", properties)):
        if given is not None:
            fields[short] = given
            if not given:
                del fields[short]
    check_properties(fields.get("p", {}))
    if embed is not None:
        options = fields.setdefault("o", {})
        for name in EMBED:
            if embed.get(name) is None:
                options.pop(name, None)
            else:
                options[name] = embed[name]
    first = _encode_fields(fields, call.task)
    if arguments is None:
        encoded = f"{first}\n{args}\n{kwargs}"
    else:
        encoded = _join(first, _check_args(*arguments), arguments[1], call.task)
    if len(encoded) > max_payload_bytes:
        raise PayloadError(f"{call.task} call as publish signal handlers changed it is "
                           f"{len(encoded)} bytes, over delayq_max_payload_bytes="
                           f"{max_payload_bytes}")
    _check_readable(encoded, call.task, max_nesting)
    return replace(call, envelope=encoded)


def _encode_fields(fields: dict[str, Any], name: str | None) -> str:
    try:
        return encode_json(fields)
    except (TypeError, ValueError, RecursionError) as exc:
        raise _not_json(name, exc) from exc


def _join(fields: str, args, kwargs, name: str | None) -> str:
    """The stored text of a call: its encoded first line, then its args and kwargs."""
    try:
        return (f"{fields}\n{encode_json(args) if args else ''}\n"
                f"{encode_json(kwargs) if kwargs else ''}")
    except (TypeError, ValueError, RecursionError) as exc:
        raise _not_json(name, exc) from exc


def _not_json(name: str | None, exc: Exception) -> PayloadError:
    if isinstance(exc, RecursionError):
        return PayloadError(f"arguments or options of {name} are nested too deeply (or hold "
                            "themselves) to be stored as JSON")
    return PayloadError(
        f"arguments or options of {name} are not JSON-serialisable ({exc}); pass plain data "
        "(str, int, float, bool, None, list, dict, datetime, UUID, Decimal; finite numbers)")


def _check_readable(encoded: str, name: str, max_nesting: int) -> None:
    """Refuse what a carrier could not read back: lists and objects nested deeper than
    ``delayq_max_nesting``, kombu's ``__type__`` objects it cannot decode, strings holding
    half of a surrogate pair."""
    if encoded.count("[") + encoded.count("{") > max_nesting and \
            nesting(encoded) > max_nesting:
        raise PayloadError(
            f"arguments or options of {name} are nested more than delayq_max_nesting="
            f"{max_nesting} levels deep; flatten them or raise the setting")
    if '"__type__"' in encoded:
        try:
            for line in encoded.split("\n"):
                if line:
                    decode_json(line)
        except ValueError as exc:
            raise PayloadError(
                f"arguments or options of {name} hold {exc}; a dict with exactly the keys "
                "__type__ and __value__ is how kombu's JSON writes a datetime, UUID, "
                "Decimal ...: pass the value itself, or rename the keys") from None
    if "\\ud" in encoded and _lone_surrogate(encoded):
        raise PayloadError(
            f"arguments or options of {name} hold a lone surrogate (half of a UTF-16 pair), "
            "which is not text; decode the bytes they came from properly")


def _lone_surrogate(text: str) -> bool:
    """True when a JSON text escapes half of a surrogate pair without the other half."""
    high_end = None  # where an escaped high half ended, waiting for its low half
    for escape in _ESCAPE.finditer(text):
        unit = escape[1]
        low = unit is not None and unit[1] in "cdef"
        if high_end is not None:
            if not (low and escape.start() == high_end):
                return True
            high_end = None
        elif low:
            return True
        elif unit is not None:
            high_end = escape.end()
    return high_end is not None


def _resolve_route(app, name: str, routed: dict[str, Any],
                   queues: Queues) -> tuple[str, str, str]:
    """(queue name, exchange name, routing key) as Celery's publisher picks them for the
    app's queue of the routed queue's name; a non-direct exchange routed without a routing
    key gets "", as kombu publishes None. A Broadcast queue is refused
    (:func:`_refuse_broadcast`); ``queues``: the app's (its router's).

    A kombu Queue object is taken by its name: natively the producer declares the Queue it
    is given, but the carrier, publishing later, declares the app's queue of that name (one
    Celery creates, for a name the app lacks), so the Queue's own exchange and routing key
    could have no binding there and the message would be dropped."""
    given = routed.get("queue")
    exchange = routed.get("exchange")
    routing_key = routed.get("routing_key")
    if given is None and exchange is None:
        given = app.amqp.default_queue
    if isinstance(given, Broadcast):  # (before a lookup adds a queue of its name)
        _refuse_broadcast(name, given)
    queue = None if given is None else queues[given if isinstance(given, str) else given.name]
    if isinstance(queue, Broadcast):
        _refuse_broadcast(name, queue)
    exchange_type = routed.get("exchange_type") or (
        queue.exchange.type if queue is not None else "direct")
    exchange = getattr(exchange, "name", exchange)
    qname = queue.name if queue is not None else ""
    if (not exchange or not routing_key) and exchange_type == "direct":
        return qname, "", qname
    if exchange is None:
        assert queue is not None  # the default queue when neither was routed
        exchange = queue.exchange.name or app.conf.task_default_exchange
        routing_key = routing_key or queue.routing_key or app.conf.task_default_routing_key
    return qname, exchange, routing_key or ""


def _refuse_broadcast(name: str, queue) -> None:
    """A Broadcast queue's name is drawn anew in each process (``bcast.<uuid>``): a carrier
    would publish to the exchange through a queue of its own, declared and bound there,
    that no worker consumes and that keeps a copy of every message."""
    raise InvalidOption(
        f"{name} routes to the Broadcast queue {queue.alias or queue.name!r} (fanout exchange "
        f"{queue.exchange.name!r}), which celery-delayq cannot delay: each process names "
        "its copy of that queue anew, so the carrier would declare one of its own bound to "
        "the exchange, which no worker reads. Send it when it is due, or through Celery's "
        "own countdown: celery.Celery.send_task(app, name, args, countdown=...)")


def _inherit_parent(app, parent, message: dict[str, Any], routed: dict[str, Any]) -> None:
    """Called from inside a task: the delayed task is its child, as with ``send_task``,
    which gives it the task's priority too with ``task_inherit_parent_priority``."""
    if not parent or ("root_id" in message and "parent_id" in message):
        return
    if parent.request.id:
        message.setdefault("root_id", parent.request.root_id or parent.request.id)
        message.setdefault("parent_id", parent.request.id)
    if app.conf.task_inherit_parent_priority:
        routed.setdefault("priority", (parent.request.delivery_info or {}).get("priority"))


def replies_to_caller(app) -> bool:
    """True when the app's result backend sends each result to the calling thread's reply
    queue, named by the message's ``reply_to`` (Celery's ``rpc://``): the stored call then
    keeps the caller's, which ``send_task`` sets."""
    from celery.backends.rpc import RPCBackend

    return isinstance(app.backend, RPCBackend)


def _absolute(expires) -> str:
    try:
        if isinstance(expires, (int, float)):
            expires = datetime.now(timezone.utc) + timedelta(seconds=expires)
        elif isinstance(expires, str):
            expires = iso_time(expires)
    except (ValueError, OverflowError) as exc:
        raise PayloadError(f"expires {expires!r} is not a time: {exc}") from exc
    if not isinstance(expires, datetime):
        raise PayloadError("expires must be seconds or a datetime (or its ISO 8601 text); "
                           f"got {expires!r}")
    if expires.tzinfo is None or expires.utcoffset() is None:
        expires = expires.replace(tzinfo=timezone.utc)  # naive is UTC, as Celery reads it
    return expires.isoformat()
