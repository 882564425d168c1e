"""``celery_delayq.http_callback``: POST a JSON body to a URL later, retried through the store.

Registered only on apps that opted in: by ``DelayQ(app)``, or by :func:`register`::

    DelayQ(app)
    app.tasks["celery_delayq.http_callback"].apply_delayed(
        ["https://partner.example.com/hooks/payment"],
        {"json": {"order": 42, "status": "paid"}, "headers": {"X-Signature": sig}},
        delay=600, key="order:42")

A 2xx answer read whole within the attempt's deadline is success. Anything else is a
failure: another status, a redirect, the deadline passing (look up, connect, send and read
the whole answer within ``timeout``), a refused connection, a TLS or protocol error, a
cut-off body. The call is retried through the store after each delay of
``delayq_http_retry_schedule`` in turn, then dead-lettered (``celery delayq ls --dead``,
replayable) with an excerpt of the last failure. Only http(s) URLs whose host is in
``delayq_http_allowed_hosts`` are accepted; a call that could never be sent is refused when
it is made, before anything is stored.
"""

from __future__ import annotations

import functools
import http.client
import ipaddress
import json as jsonlib
import logging
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from celery import Celery, current_app
from celery.local import Proxy
from celery.utils.saferepr import saferepr

from .envelope import HEADER_JOB, HEADER_KEY
from .errors import DelayQError
from .extension import DelayQ
from .http_policy import CallbackRefused, check_call, check_request, shown, shown_call
from .http_policy import check_url as check_url  # re-exported: callers import it from here
from .task import DelayedTask

TASK_NAME = "celery_delayq.http_callback"
#: Most characters of a response body or an error kept (in results, errors and dead letters).
EXCERPT_CHARS = 200
_USER_AGENT = "celery-delayq-http-callback"
_DRAIN_BYTES = 64 * 1024

logger = logging.getLogger(__name__)


class CallbackFailed(DelayQError):
    """An attempt failed (no 2xx answer read whole); the message has what went wrong."""


@dataclass(frozen=True)
class Response:
    """What one attempt got: a status (None when no answer), a body excerpt, and what
    went wrong after the status, if anything."""

    status: int | None
    excerpt: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status is not None and 200 <= self.status < 300

    def describe(self) -> str:
        if self.status is None:
            return f"no answer ({self.error})"
        if self.error is not None:
            return f"HTTP {self.status}, then {self.error}"
        return f"HTTP {self.status}: {self.excerpt!r}"


class _Deadline:
    """The moment an attempt has to be over."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left; ``TimeoutError`` once there are none."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        return left


class _LookupTimedOut(TimeoutError):
    """The host's addresses did not come within the attempt's deadline."""


#: Lookups waiting on the resolver at once; more wait for one to end (within their deadline).
_LOOKUPS = threading.BoundedSemaphore(16)


def _addresses(host: str, port: int, deadline: _Deadline) -> list[tuple[Any, ...]]:
    """``getaddrinfo`` within the time left. A resolver that drops queries holds a lookup
    for its own timeouts (5 s a try in glibc); the attempt stops waiting at its deadline
    and the lookup ends unwatched in its thread. Numeric addresses need no thread."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    found: list[list[tuple[Any, ...]]] = []
    failed: list[Exception] = []
    done = threading.Event()

    def lookup() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
        except Exception as exc:  # raised in the attempt's thread, as if looked up there
            failed.append(exc)
        finally:
            _LOOKUPS.release()
            done.set()

    if not _LOOKUPS.acquire(timeout=deadline.left()):
        raise _LookupTimedOut(f"no address for {host}")
    threading.Thread(target=lookup, name=f"http_callback lookup {host}", daemon=True).start()
    if not done.wait(deadline.left()):
        raise _LookupTimedOut(f"no address for {host}")
    if failed:
        raise failed[0]
    return found[0]


if TYPE_CHECKING:  # what the mixins below are mixed into
    _SocketBase = socket.socket
    _ConnectionBase = http.client.HTTPConnection
else:
    _SocketBase = _ConnectionBase = object


class _DeadlineIO(_SocketBase):
    """Socket I/O that gives each call only the time left before ``deadline``: a server
    dripping a byte at a time cannot stretch an attempt past it."""

    deadline: _Deadline | None = None

    def _keep_to_deadline(self) -> None:
        if self.deadline is not None:
            self.settimeout(self.deadline.left())

    def recv(self, *args: Any, **kwargs: Any) -> Any:
        self._keep_to_deadline()
        return super().recv(*args, **kwargs)

    def recv_into(self, *args: Any, **kwargs: Any) -> Any:
        self._keep_to_deadline()
        return super().recv_into(*args, **kwargs)

    def send(self, *args: Any, **kwargs: Any) -> Any:
        self._keep_to_deadline()
        return super().send(*args, **kwargs)

    def sendall(self, *args: Any, **kwargs: Any) -> Any:
        self._keep_to_deadline()
        return super().sendall(*args, **kwargs)


class _Socket(_DeadlineIO, socket.socket):
    pass


class _TLSSocket(_DeadlineIO, ssl.SSLSocket):
    """Its handshake is bounded by the timeout it inherits (the time left)."""


class _DeadlineConnection(_ConnectionBase):
    """An ``http.client`` connection whose sockets keep to ``deadline``."""

    def __init__(self, *args: Any, deadline: _Deadline, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = deadline
        self._create_connection = self._open_socket

    def _open_socket(self, address, timeout, source_address=None) -> _Socket:
        """The host's addresses tried in turn, as ``socket.create_connection`` does, but
        each with the time left (it gives each one the whole timeout)."""
        host, port = address
        error: OSError = OSError("getaddrinfo returns an empty list")
        for family, kind, proto, _, target in _addresses(host, port, self.deadline):
            sock = _Socket(family, kind, proto)
            try:
                sock.settimeout(self.deadline.left())
                if source_address:
                    sock.bind(source_address)
                sock.connect(target)
            except OSError as exc:  # TimeoutError too, once the deadline has passed
                sock.close()
                error = exc
                continue
            sock.deadline = self.deadline
            sock._keep_to_deadline()
            return sock
        raise error

    def connect(self) -> None:
        super().connect()
        sock = cast(_DeadlineIO, self.sock)  # a _TLSSocket wrapping the _Socket, or that
        sock.deadline = self.deadline


class _HTTPConnection(_DeadlineConnection, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_DeadlineConnection, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(functools.partial(_HTTPConnection, deadline=_Deadline(req.timeout)),
                            req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req):
        # urllib keeps the handler's context in _context, which typeshed does not declare
        return self.do_open(functools.partial(_HTTPSConnection, deadline=_Deadline(req.timeout)),
                            req, context=self._context)  # type: ignore[attr-defined]


class _EveryAnswer(urllib.request.HTTPErrorProcessor):
    """Every answer comes back as it is. A redirect is a failure like any other non-2xx:
    following it could leave the allow-list, and a POST turned into a GET drops the body."""

    def http_response(self, request, response):
        return response

    https_response = http_response


@functools.cache
def _opener() -> urllib.request.OpenerDirector:
    """urllib (environment proxies included) with a deadline per attempt; built on first use."""
    tls = ssl.create_default_context()
    tls.set_alpn_protocols(["http/1.1"])
    tls.sslsocket_class = _TLSSocket
    return urllib.request.build_opener(_HTTPHandler, _HTTPSHandler(context=tls), _EveryAnswer)


def post(url: str, body: Any, headers: Mapping[str, str] | None, timeout: float) -> Response:
    """POST ``body`` as JSON: connect, send and read the whole answer within ``timeout``
    seconds. Only an excerpt of the answer is kept."""
    data = jsonlib.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": _USER_AGENT, **(headers or {})})
    status = None
    try:
        with _opener().open(request, timeout=timeout) as answer:
            status = answer.status
            return Response(status, _read_body(answer))
    except Exception as exc:  # every failure is retried, then dead-lettered: none is lost
        if not isinstance(exc, (OSError, http.client.HTTPException)):
            logger.error("http_callback: unexpected %s from POST %s; counted as a failed "
                         "attempt", type(exc).__name__, shown(url), exc_info=True)
        return Response(status, "", _what_failed(exc, url, timeout))


def _read_body(answer: http.client.HTTPResponse) -> str:
    """An excerpt of the body; the rest is read and dropped, so a cut-off body fails."""
    raw = answer.read(EXCERPT_CHARS * 4)  # at most 4 bytes per character in UTF-8
    while answer.read(_DRAIN_BYTES):
        pass
    if answer.length:  # the connection closed before Content-Length bytes came
        raise http.client.IncompleteRead(b"", answer.length)
    return raw.decode("utf-8", errors="replace")[:EXCERPT_CHARS]


def _what_failed(exc: Exception, url: str, timeout: float) -> str:
    """A one-line excerpt of ``exc``: bounded, printable, without the URL's secrets."""
    cause = exc.reason if isinstance(exc, urllib.error.URLError) and isinstance(
        exc.reason, BaseException) else exc
    if isinstance(cause, _LookupTimedOut):
        return f"timed out: {cause} within {timeout:g} s"
    if isinstance(cause, TimeoutError):
        return f"timed out: no complete answer within {timeout:g} s"
    name, text = type(cause).__name__, str(cause).replace(url, shown(url))
    text = text if text.startswith(name) else f"{name}: {text}"
    printable = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return printable[:EXCERPT_CHARS]


class HttpCallbackTask(DelayedTask):
    """DelayedTask that refuses bad URLs and arguments at the call site, and shows calls
    without their secrets."""

    abstract = True

    def apply_delayed(self, args=None, kwargs=None, **options: Any):
        check_call(args, kwargs, DelayQ.of(self.app).config)
        return super().apply_delayed(args, kwargs, **{**self._reprs(args, kwargs), **options})

    def apply_async(self, args=None, kwargs=None, *rest: Any, **options: Any):
        check_call(args, kwargs, DelayQ.of(self.app).config)
        return super().apply_async(args, kwargs, *rest,
                                   **{**self._reprs(args, kwargs), **options})

    def apply_delayed_many(self, items, **options: Any):
        """Every call checked first: one that could never be made refuses the batch. Their
        arguments show as given unless ``argsrepr`` / ``kwargsrepr`` (for every call) say
        otherwise."""
        items = list(items)
        config = DelayQ.of(self.app).config
        for item in items:
            check_call(item.get("args"), item.get("kwargs"), config)
        return super().apply_delayed_many(items, **options)

    def _reprs(self, args, kwargs) -> dict[str, str]:
        """The call's ``argsrepr`` / ``kwargsrepr`` (what logs, events and the admin show,
        unless the caller gives its own): the URL ``shown``, header values ``***``."""
        args, kwargs = shown_call(args, kwargs)
        size = self.app.amqp.argsrepr_maxsize
        return {"argsrepr": saferepr(args, size), "kwargsrepr": saferepr(kwargs, size)}


def register(app: Celery) -> None:
    """Register ``celery_delayq.http_callback`` on ``app`` (``DelayQ(app)`` does it).

    Only on this app, never on every app as a shared task would be. An app not finalized
    yet gets the task when it is, so its configuration is read as late as Celery reads it.
    An app that has no DelayQ yet is opted in (which registers the task).
    """
    if DelayQ.lookup(app) is None:
        DelayQ(app)
        return
    if not app.finalized:
        app.on_after_finalize.connect(_on_finalized, weak=False, dispatch_uid=TASK_NAME)
        return
    app.task(_http_callback, name=TASK_NAME, base=HttpCallbackTask, bind=True, shared=False,
             lazy=False, max_retries=None, serializer="json")


def unregister(app: Celery) -> None:
    """Undo :func:`register` (``DelayQ._opt_out`` does it): the task leaves the app, and
    an app finalized later does not get it."""
    app.on_after_finalize.disconnect(_on_finalized, dispatch_uid=TASK_NAME)
    app._tasks.pop(TASK_NAME, None)


def _on_finalized(sender: Celery, **_: Any) -> None:
    register(sender)


def _current() -> HttpCallbackTask:
    app = current_app._get_current_object()
    if DelayQ.lookup(app) is None:
        raise DelayQError(f"celery_delayq.http_callback is registered only on apps that use "
                          f"celery-delayq; call DelayQ(app) on {app.main or 'the app'} first")
    return app.tasks[TASK_NAME]


class _CurrentTask(Proxy):
    """The current app's task, looked up on use. Only using it needs an app with a
    ``DelayQ``: without one, introspection (``isinstance``, and gc walkers such as gevent's
    monkey-patching, which ask every object its class) sees the proxy itself, as werkzeug's
    unbound LocalProxy does."""

    @property  # type: ignore[misc]  # a read-only override of Proxy's
    def __class__(self) -> type:
        try:
            return self._get_class()
        except DelayQError:
            return type(self)


#: The current app's ``celery_delayq.http_callback`` (it must have a ``DelayQ``).
http_callback: HttpCallbackTask = _CurrentTask(_current)


def _http_callback(self, url: str, json: Any = None, headers: Mapping[str, str] | None = None,
                   timeout: float | None = None) -> dict[str, Any]:
    """POST ``json`` to ``url``; 2xx returns ``{"status", "excerpt"}``, else retry or dead."""
    config = DelayQ.of(self.app).config
    try:  # again: the worker's settings may be stricter, or the call came by name
        check_request(url, headers, timeout, config.http_allowed_hosts)
    except CallbackRefused as refused:
        _dead_letter(self, url, json, headers, timeout,
                     f"http_callback refused by the worker: {refused}")
        raise
    response = post(url, json, headers, timeout or config.http_timeout)
    if response.ok:
        return {"status": response.status, "excerpt": response.excerpt}
    attempt = self.request.retries or 0
    schedule = config.http_retry_schedule
    failure = CallbackFailed(
        f"POST {shown(url)} failed (attempt {attempt + 1}): {response.describe()}")
    if attempt < len(schedule):
        raise self.retry(countdown=schedule[attempt], exc=failure)
    _dead_letter(self, url, json, headers, timeout,
                 f"http_callback gave up after {attempt + 1} attempts; "
                 f"last: {response.describe()}")
    raise failure


def _dead_letter(task, url: str, json: Any, headers, timeout, reason: str) -> None:
    """Keep the call (replayable, with a fresh schedule) as dead, with ``reason``."""
    request = task.request
    delayq = DelayQ.of(task.app)
    job_id = request.get(HEADER_JOB) or request.id
    key = request.get(HEADER_KEY)
    call, _ = delayq._prepare(task.name, [url], {"json": json, "headers": headers,
                                                 "timeout": timeout},
                              0, None, key, job_id, task, {"task_id": request.id})
    delayq.store.bury(job_id, key, call.envelope, reason)
