"""``celery_delayq.http_callback``: POST a JSON body to a URL later, retried through the store.

Registered on every Celery app (a shared task, imported by ``celery_delayq``)::

    from celery_delayq.http import http_callback

    http_callback.apply_delayed(
        ["https://partner.example.com/hooks/payment"],
        {"json": {"order": 42, "status": "paid"}, "headers": {"X-Signature": sig}},
        delay=600, key="order:42")

A 2xx answer is success. Any other status, a redirect, a timeout or a connection error
is a failure: the call is retried through the store after each delay of
``delayq_http_retry_schedule`` in turn, then dead-lettered (``celery delayq ls --dead``,
replayable) with the last status and a short excerpt of the last response.
Only http(s) URLs whose host is in ``delayq_http_allowed_hosts`` are accepted; a URL
that is not is refused when the call is made, before anything is stored.
"""

from __future__ import annotations

import fnmatch
import json as jsonlib
import math
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from celery import shared_task

from .envelope import HEADER_JOB, HEADER_KEY, build
from .errors import DelayQError
from .extension import DelayQ
from .task import DelayedTask

TASK_NAME = "celery_delayq.http_callback"
#: Most characters of a response body kept (in results, errors and dead letters).
EXCERPT_CHARS = 200
_SCHEMES = ("http", "https")
_USER_AGENT = "celery-delayq-http-callback"


class CallbackRefused(DelayQError, ValueError):
    """The URL or arguments of an HTTP callback cannot be used; it is never retried."""


class CallbackFailed(DelayQError):
    """An attempt got a non-2xx answer or no answer; the message has status and excerpt."""


@dataclass(frozen=True)
class Response:
    """What one attempt got: a status (None when no answer) and a body excerpt."""

    status: int | None
    excerpt: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def describe(self) -> str:
        if self.status is None:
            return f"no answer ({self.error})"
        return f"HTTP {self.status}: {self.excerpt!r}"


def check_url(url: object, allowed_hosts: tuple[str, ...]) -> str:
    """``url`` if it is an http(s) URL of an allowed host; :class:`CallbackRefused` if not."""
    if not isinstance(url, str):
        raise CallbackRefused(f"the callback URL must be a string, got {type(url).__name__}")
    parts = urlsplit(url)
    if parts.scheme not in _SCHEMES or not parts.hostname:
        raise CallbackRefused(f"only http:// and https:// URLs can be called back, got {url!r}")
    if parts.username is not None or parts.password is not None:
        raise CallbackRefused("the callback URL must not carry credentials; send them in "
                              "headers= (stored with the call) instead")
    host = parts.hostname.lower()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    for pattern in allowed_hosts:
        name, allowed_port = _split_pattern(pattern)
        if allowed_port is not None and allowed_port != port:
            continue
        if name in ("*", host) or (name.startswith("*.") and fnmatch.fnmatchcase(host, name)):
            return url
    if not allowed_hosts:
        raise CallbackRefused(
            f"{host} is not an allowed callback host: delayq_http_allowed_hosts is empty, "
            f"which refuses every URL; add {host!r} to it")
    raise CallbackRefused(
        f"{host}:{port} is not in delayq_http_allowed_hosts {list(allowed_hosts)}; add it "
        "there to allow callbacks to it")


def _split_pattern(pattern: str) -> tuple[str, int | None]:
    """``"host"`` -> (host, None); ``"host:8080"`` / ``"[::1]:8080"`` -> (host, 8080)."""
    if pattern.startswith("["):
        name, _, rest = pattern[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        name, sep, port = pattern.rpartition(":")
        if not sep or ":" in name:  # no port, or a bare IPv6 address
            name, port = pattern, ""
    return name, int(port) if port.isdigit() else None


def check_call(args, kwargs, config) -> None:
    """Refuse an http_callback call with unusable arguments, before it is stored."""
    args, kwargs = list(args or ()), dict(kwargs or {})
    names = ("url", "json", "headers", "timeout")
    if len(args) > len(names):
        raise CallbackRefused(f"http_callback takes at most {len(names)} positional arguments")
    call = dict(zip(names, args, strict=False))
    unknown = set(kwargs) - set(names)
    if unknown or set(call) & set(kwargs):
        raise CallbackRefused(f"http_callback takes url, json, headers, timeout; got "
                              f"{sorted(unknown or set(call) & set(kwargs))} unexpected or twice")
    call.update(kwargs)
    if "url" not in call:
        raise CallbackRefused("http_callback needs a url")
    check_url(call["url"], config.http_allowed_hosts)
    headers = call.get("headers")
    if headers is not None and not (isinstance(headers, Mapping) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items())):
        raise CallbackRefused("headers= must map header names to string values")
    timeout = call.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(
            timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0):
        raise CallbackRefused(f"timeout= must be a positive number of seconds, got {timeout!r}")


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer like any other non-2xx: following it could leave the
    allow-list, and a POST turned into a GET would drop the body."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_opener = urllib.request.build_opener(_NoRedirects)


def post(url: str, body: Any, headers: Mapping[str, str] | None, timeout: float) -> Response:
    """POST ``body`` as JSON; read no more of the answer than an excerpt."""
    data = jsonlib.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": _USER_AGENT, **(headers or {})})
    try:
        with _opener.open(request, timeout=timeout) as answer:
            return Response(answer.status, _excerpt(answer))
    except urllib.error.HTTPError as exc:
        with exc:
            return Response(exc.code, _excerpt(exc))
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return Response(None, "", f"{type(exc).__name__}: {reason}")


def _excerpt(answer) -> str:
    raw = answer.read(EXCERPT_CHARS * 4)  # at most 4 bytes per character in UTF-8
    return raw.decode("utf-8", errors="replace")[:EXCERPT_CHARS]


class HttpCallbackTask(DelayedTask):
    """DelayedTask that refuses bad URLs and arguments at the call site."""

    abstract = True

    def apply_delayed(self, args=None, kwargs=None, **options: Any):
        check_call(args, kwargs, DelayQ.of(self.app).config)
        return super().apply_delayed(args, kwargs, **options)

    def apply_async(self, args=None, kwargs=None, *rest: Any, **options: Any):
        check_call(args, kwargs, DelayQ.of(self.app).config)
        return super().apply_async(args, kwargs, *rest, **options)


@shared_task(bind=True, base=HttpCallbackTask, name=TASK_NAME, max_retries=None,
             serializer="json")
def http_callback(self, url: str, json: Any = None, headers: Mapping[str, str] | None = None,
                  timeout: float | None = None) -> dict[str, Any]:
    """POST ``json`` to ``url``; 2xx returns ``{"status", "excerpt"}``, else retry or dead."""
    config = DelayQ.of(self.app).config
    check_url(url, config.http_allowed_hosts)  # the worker's settings may be stricter
    response = post(url, json, headers, timeout or config.http_timeout)
    if response.ok:
        return {"status": response.status, "excerpt": response.excerpt}
    attempt = self.request.retries or 0
    schedule = config.http_retry_schedule
    failure = CallbackFailed(f"POST {url} failed (attempt {attempt + 1}): {response.describe()}")
    if attempt < len(schedule):
        raise self.retry(countdown=schedule[attempt], exc=failure)
    _dead_letter(self, url, json, headers, timeout, attempt + 1, response)
    raise failure


def _dead_letter(task, url: str, json: Any, headers, timeout, attempts: int,
                 response: Response) -> None:
    """Keep the call (replayable, with a fresh schedule) and the last answer as dead."""
    request = task.request
    delayq = DelayQ.of(task.app)
    job_id = request.get(HEADER_JOB) or request.id
    key = request.get(HEADER_KEY)
    call = build(task.app, task.name, [url], {"json": json, "headers": headers,
                                               "timeout": timeout},
                 {"task_id": request.id}, job_id=job_id, key=key,
                 max_payload_bytes=delayq.config.max_payload_bytes, task_type=task)
    reason = f"http_callback gave up after {attempts} attempts; last: {response.describe()}"
    delayq.store.bury(job_id, key, call.envelope, reason)
