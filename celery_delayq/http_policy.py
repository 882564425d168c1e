"""What ``celery_delayq.http_callback`` may be called with: an http(s) URL of a host in
``delayq_http_allowed_hosts`` (the guard against calls into an internal network; a host name
is matched as written, never resolved, so it may hold no %-escape), in ASCII, without
credentials, spaces or control characters, with a valid port; header names that are HTTP
tokens and Latin-1 values without control characters; a positive timeout. A call that breaks
one is :class:`CallbackRefused` before anything is stored (``check_call``), and again by the
worker before each attempt (``check_request``). ``shown`` is how a callback URL is printed:
without its secrets; ``shown_call`` how a call's arguments are.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import SplitResult, urlsplit, urlunsplit

from .errors import DelayQError
from .settings import HostList

_SCHEMES = ("http", "https")
#: What http.client refuses in a request target: spaces and control characters.
_UNSENDABLE_URL = re.compile(r"[\x00-\x20\x7f]")
#: A host name as the allow-list matches it. urllib decodes %xx in a host and http.client
#: writes it raw (into a proxy's CONNECT line too): a name holds none.
_HOST_NAME = re.compile(r"[A-Za-z0-9._-]+")
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an RFC 9110 token
_HEADER_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # control characters but tab


class CallbackRefused(DelayQError, ValueError):
    """The URL or arguments of an HTTP callback cannot be used; it is never retried."""

    __module__ = "celery_delayq.http"  # its public name, as results and tracebacks show it


def shown(url: str) -> str:
    """``url`` as errors, reasons and logs show it: no userinfo, every query value ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<malformed URL>"
    query = "&".join(name + ("=***" if equals else "") for name, equals, _ in
                     (pair.partition("=") for pair in parts.query.split("&"))) \
        if parts.query else ""
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, query, ""))


def check_url(url: object, allowed_hosts: tuple[str, ...]) -> str:
    """``url`` if it is an http(s) URL of an allowed host; :class:`CallbackRefused` if not."""
    if not isinstance(url, str):
        raise CallbackRefused(f"the callback URL must be a string, got {type(url).__name__}")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise CallbackRefused(f"the callback URL is malformed ({exc}); give a URL such as "
                              "https://api.example.com/hook") from None
    if parts.scheme not in _SCHEMES or not parts.hostname:
        raise CallbackRefused(
            f"only http:// and https:// URLs can be called back, got {shown(url)!r}")
    if parts.username is not None or parts.password is not None:
        raise CallbackRefused("the callback URL must not carry credentials; send them in "
                              "headers= (stored with the call) instead")
    if _UNSENDABLE_URL.search(url):
        raise CallbackRefused(f"the callback URL {shown(url)!r} holds a space or control "
                              "character; percent-encode it (a space is %20)")
    if not url.isascii():
        raise CallbackRefused(f"the callback URL {shown(url)!r} holds a character that is not "
                              "ASCII; percent-encode it (é is %C3%A9), and write an "
                              "internationalised host name in its xn-- (IDNA) form")
    host, port = _host(parts), _port(parts, url)
    for pattern in allowed_hosts:
        name, allowed_port = HostList.split(pattern)
        if allowed_port not in (None, port):
            continue
        if name in ("*", host) or (name.startswith("*.") and host.endswith(name[1:])):
            return url
    if not allowed_hosts:
        raise CallbackRefused(
            f"{host} is not an allowed callback host: delayq_http_allowed_hosts is empty, "
            f"which refuses every URL; add {host!r} to it")
    raise CallbackRefused(
        f"{host}:{port} is not in delayq_http_allowed_hosts {list(allowed_hosts)}; add it "
        "there to allow callbacks to it")


def _host(parts: SplitResult) -> str:
    host = parts.hostname or ""
    try:  # an IPv6 address as the allow-list holds it
        return ipaddress.IPv6Address(host).compressed
    except ValueError:
        pass
    if "[" in parts.netloc or not _HOST_NAME.fullmatch(host):
        raise CallbackRefused(
            f"the callback URL's host {host!r} is not a host name: a name may hold only "
            "letters, digits, '.', '-' and '_', written as they are (no %-escapes; an "
            "internationalised name in its xn-- form), and an IPv6 address goes in brackets")
    return host


def _port(parts: SplitResult, url: str) -> int:
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise CallbackRefused(f"the callback URL {shown(url)!r} has an invalid port; give a "
                              "port from 1 to 65535, or none for the scheme's default")
    return port or (443 if parts.scheme == "https" else 80)


#: Headers of the request's own framing and routing, never the caller's (``Proxy-*`` too).
_FRAMING = frozenset({"host", "content-length", "transfer-encoding", "connection",
                      "keep-alive", "upgrade", "te", "trailer", "expect"})


def check_request(url: object, headers: object, timeout: object,
                  allowed_hosts: tuple[str, ...]) -> None:
    """Refuse a callback that could never be sent, with :class:`CallbackRefused`."""
    check_url(url, allowed_hosts)
    if headers is not None:
        if not (isinstance(headers, Mapping) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in headers.items())):
            raise CallbackRefused("headers= must map header names to string values")
        for name, value in headers.items():
            if not _HEADER_NAME.fullmatch(name):
                raise CallbackRefused(f"header name {name!r} is not an HTTP token: use "
                                      "letters, digits and !#$%&'*+-.^_`|~")
            if name.lower() in _FRAMING or name.lower().startswith("proxy-"):
                raise CallbackRefused(
                    f"header {name!r} may not be set: the request sets its own host, length "
                    "and connection from its URL and body (set by the caller, the request "
                    "could name a host the allow-list did not check, or disagree with its body)")
            if _HEADER_CONTROL.search(value) or not _latin1(value):
                raise CallbackRefused(f"the value of header {name!r} must be Latin-1 text "
                                      "without control characters (CR, LF, NUL, ...)")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(
            timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0):
        raise CallbackRefused(f"timeout= must be a positive number of seconds, got {timeout!r}")


def _latin1(text: str) -> bool:
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


#: http_callback's parameters, in order.
_PARAMETERS = ("url", "json", "headers", "timeout")


def check_call(args, kwargs, config) -> None:
    """Refuse an http_callback call with unusable arguments, before it is stored."""
    args, kwargs = list(args or ()), dict(kwargs or {})
    if len(args) > len(_PARAMETERS):
        raise CallbackRefused(
            f"http_callback takes at most {len(_PARAMETERS)} positional arguments")
    call = dict(zip(_PARAMETERS, args, strict=False))
    unknown = set(kwargs) - set(_PARAMETERS)
    if unknown or set(call) & set(kwargs):
        raise CallbackRefused(f"http_callback takes url, json, headers, timeout; got "
                              f"{sorted(unknown or set(call) & set(kwargs))} unexpected or twice")
    call.update(kwargs)
    if "url" not in call:
        raise CallbackRefused("http_callback needs a url")
    check_request(call["url"], call.get("headers"), call.get("timeout"),
                  config.http_allowed_hosts)


def shown_call(args, kwargs) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A checked call's arguments as logs and monitoring show them: the URL ``shown``,
    every header value ``***``."""
    def hidden(name: str, value: Any) -> Any:
        if name == "url":
            return shown(value)
        return dict.fromkeys(value, "***") if name == "headers" and value else value
    return (tuple(hidden(name, value) for name, value in zip(_PARAMETERS, args or (),
                                                              strict=False)),
            {name: hidden(name, value) for name, value in (kwargs or {}).items()})
