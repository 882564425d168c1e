"""The Celery message of a stored job, rebuilt at promotion.

Celery's own ``create_task_message`` builds the protocol-2 message ``apply_async`` would
have sent, with ``eta`` the due time (past by then: the worker runs it at once) and the
``delayq_*`` headers that tell a worker (and a retry) which job it runs. What a message
takes from an envelope's first line (task, routing, options, headers, properties) is built
once per distinct line, with the task's business key and fixed task id left out, and kept
as a :class:`_Shape`; each job then adds its ids, key and arguments. The body is the
stored args and kwargs lines verbatim: the JSON a worker decodes.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from celery.utils.saferepr import saferepr

from .decoding import decode_arguments, decode_fields, split
from .envelope import (
    HEADER_DUE,
    HEADER_JOB,
    HEADER_KEY,
    HEADER_SHARD,
    ORIGIN,
    REPRS,
    check_properties,
    encode_json,
)
from .errors import PayloadError
from .reading import MAX_MS, MIN_MS, is_text, iso_time

_SHAPES_MAX = 1024  # distinct first lines kept; the cache starts over when it is full
_OWN = ("y", "i")  # first-line fields of one job: its business key and fixed task id
_TASK_ID = "\x00delayq-task-id"  # stands for the task id while a shape is built


def eta_header(due_ms: float) -> str | None:
    """The ``eta`` header of a promoted job: its due time, UTC, to the millisecond (what
    ``request.eta`` shows; already past when the worker gets it, so it runs at once).
    None outside years 1-9999; the direct promotion script writes the same text."""
    if not MIN_MS <= due_ms <= MAX_MS:
        return None
    seconds, ms = divmod(math.floor(due_ms), 1000)
    return f"{_second(seconds)}.{ms:03d}+00:00"


@functools.lru_cache(maxsize=64)  # the jobs of a batch fall due in a few seconds
def _second(seconds: int) -> str:
    year, month, day, hour, minute, second = time.gmtime(seconds)[:6]
    return f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"


class Message(NamedTuple):
    """A Celery protocol-2 message ready for ``kombu.Producer.publish``."""

    body: bytes  # JSON (content type application/json, utf-8)
    headers: dict[str, Any]
    properties: dict[str, Any]
    queue: str
    exchange: str
    routing_key: str
    task: str
    key: str | None


@dataclass(frozen=True)
class _Shape:
    """The parts of a message that an envelope's first line decides."""

    task: str
    headers: dict[str, Any]
    properties: dict[str, Any]
    id_headers: tuple[str, ...]  # the headers and properties that hold the task id
    id_properties: tuple[str, ...]
    embed: str  # the body's third element (callbacks, errbacks, chain, chord), as JSON
    reprs: dict[str, str]  # the argsrepr / kwargsrepr the call gave, if any
    expires_at: float | None  # the absolute expiry, as a timestamp
    queue: str
    exchange: str
    routing_key: str


class MessageBuilder:
    """Rebuilds the messages of one app's stored jobs."""

    def __init__(self, app) -> None:
        amqp = app.amqp
        self._create = amqp.create_task_message
        self._repr_max = amqp.argsrepr_maxsize
        # Celery 5.7+ shortens reprs at task_repr_maxlevels; older Celery at saferepr's default.
        levels = app.conf.get("task_repr_maxlevels")
        self._repr_levels: dict[str, int] = {} if levels is None else {"maxlevels": levels}
        self._default_queue = amqp.default_queue.name
        self._shapes: dict[str, _Shape] = {}

    def build(self, job_id: str, raw: str | bytes | None, *, shard: int,
              due_ms: int | None) -> Message:
        """The message of one stored job; :class:`PayloadError` when its envelope or due
        time is unusable (the carrier then dead-letters it)."""
        if due_ms is None:
            raise PayloadError("its stored due time is not a finite number")
        if not job_id.isascii() and not is_text(job_id):  # read from bytes not UTF-8
            raise PayloadError("its job id is not valid UTF-8")
        line, args_line, kwargs_line = split(raw)
        shape, own = self._shapes.get(line), None
        if shape is None:
            shape, own = self._shape_of(line)
        args, kwargs = decode_arguments(args_line, kwargs_line)
        task_id = own.get("i", job_id) if own else job_id
        key = own.get("y") if own else None

        headers = shape.headers.copy()
        for name in shape.id_headers:
            headers[name] = task_id
        shown = tuple(args)  # as callers give them (delay(*args)): "(1,)", not "[1]"
        if len(args_line) + len(kwargs_line) < self._repr_max // 4:  # short: plain repr
            headers["argsrepr"], headers["kwargsrepr"] = repr(shown), repr(kwargs)
        else:  # as Celery shortens them (it stops at a depth: never too deep)
            headers["argsrepr"] = saferepr(shown, self._repr_max, **self._repr_levels)
            headers["kwargsrepr"] = saferepr(kwargs, self._repr_max, **self._repr_levels)
        headers.update(shape.reprs)
        headers[HEADER_JOB], headers[HEADER_SHARD], headers[HEADER_DUE] = job_id, shard, due_ms
        headers["eta"] = eta_header(due_ms)
        if key:
            headers[HEADER_KEY] = key
        properties = shape.properties.copy()
        for name in shape.id_properties:
            properties[name] = task_id
        if shape.expires_at is not None:
            properties["expiration"] = max(shape.expires_at - time.time(), 0)
        body = f"[{args_line or '[]'},{kwargs_line or '{}'},{shape.embed}]".encode()
        return Message(body, headers, properties, shape.queue, shape.exchange,
                       shape.routing_key, shape.task, key)

    def _shape_of(self, line: str) -> tuple[_Shape, dict[str, str]]:
        """The shape of a first line and the fields it holds for one job alone."""
        fields = decode_fields(line)
        own = {name: fields.pop(name) for name in _OWN if name in fields}
        try:
            common = encode_json(fields) if own else line
        except ValueError as exc:  # NaN / Infinity in the options
            raise PayloadError(f"envelope options are unusable: {exc}") from exc
        shape = self._shapes.get(common)
        if shape is None:
            shape = self._build_shape(fields)
            if len(self._shapes) >= _SHAPES_MAX:
                self._shapes.clear()
            self._shapes[common] = shape
        return shape, own

    def _build_shape(self, fields: dict[str, Any]) -> _Shape:
        given = fields.get("o", {})
        # ignore_result null unless the call's is not its task's own (envelope.py)
        options = {"origin": ORIGIN, "ignore_result": None, **dict.fromkeys(REPRS, ""),
                   **given}
        expires = options.get("expires")
        try:
            headers, properties, body, _ = self._create(
                _TASK_ID, fields["t"], [], {}, **options)
            expires_at = iso_time(expires).timestamp() if expires else None
            embed = encode_json(body[2])
            headers.update(fields.get("h", {}))
            properties.update(fields.get("p", {}))
            check_properties(properties)  # (InvalidOption is a ValueError)
        except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as exc:
            raise PayloadError(f"envelope options are unusable: {exc!r}") from exc
        queue = fields.get("q") or self._default_queue
        return _Shape(
            task=fields["t"], headers=headers, properties=properties,
            id_headers=tuple(name for name, value in headers.items() if value == _TASK_ID),
            id_properties=tuple(name for name, value in properties.items()
                                if value == _TASK_ID),
            embed=embed,
            # the call's own (as an option or a header): its arguments may hold secrets
            reprs={name: headers[name] for name in REPRS
                   if name in given or name in fields.get("h", {})},
            expires_at=expires_at,
            queue=queue, exchange=fields.get("x", ""), routing_key=fields.get("r", queue))
