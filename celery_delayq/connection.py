"""The store's Redis client, built from its URL; URLs made safe to print.

Store URLs:

- ``redis://``, ``rediss://``, ``unix://`` as redis-py reads them (``?password=`` included);
- ``redis+cluster://`` / ``rediss+cluster://`` a seed node of a Redis Cluster;
- ``sentinel://host:26379;sentinel://host2:26379/0``: the master a set of Sentinels names,
  as kombu's Redis Sentinel transport reads it (``master_name``, ``sentinel_kwargs``,
  ``min_other_sentinels`` from the transport options). The password and database of the
  URL are the master's; ``sentinel_kwargs`` are the options of the Sentinel connections.

TLS options (``delayq_redis_ssl``, or ``broker_use_ssl`` for a store on the broker URL) are
redis-py's ``ssl_*`` keyword arguments, as kombu passes ``broker_use_ssl`` to a Redis broker.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import RedisCluster
from redis.connection import SSLConnection, parse_url
from redis.exceptions import RedisClusterException, ResponseError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection

from .errors import ConfigurationError

try:
    from hiredis import pack_command as _PACK
except ImportError:  # hiredis < 2.1 has no pack_command
    _PACK = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from .conf import DelayQConfig

#: ``redis+cluster://host:port`` (or ``rediss+cluster://``) names a Redis Cluster seed node.
CLUSTER_SUFFIX = "+cluster"
SENTINEL_SCHEME = "sentinel"
SENTINEL_PORT = 26379
#: The transport options a ``sentinel://`` store reads (others are ignored, so
#: ``broker_transport_options`` can be passed as they are).
SENTINEL_OPTIONS = ("master_name", "sentinel_kwargs", "min_other_sentinels")

_RETRY_ON = [redis.ConnectionError, redis.TimeoutError]
_BACKOFF_CAP = 1.0  # seconds, the longest wait between two tries of a call
#: What a pool's ``get_connection`` is given: redis-py before 5.3 needs a command name,
#: later versions warn that it is deprecated.
GET_CONNECTION_ARGS = ("EVALSHA",) if redis.VERSION < (5, 3) else ()
_CERT_REQS = {"CERT_NONE": "none", "CERT_OPTIONAL": "optional", "CERT_REQUIRED": "required"}


def connect(config: DelayQConfig) -> redis.Redis | RedisCluster:
    """A client of the store ``config`` names; connections are opened on first use."""
    options: dict[str, Any] = {
        "decode_responses": True,
        # bytes that are not UTF-8 (a damaged value) read as lone surrogates instead of
        # failing the whole reply; keys.raw_id writes such an id back byte for byte
        "encoding_errors": "surrogateescape",
        "socket_timeout": config.redis_socket_timeout,
        "socket_connect_timeout": config.redis_socket_timeout,
        "retry": Retry(ExponentialBackoff(cap=_BACKOFF_CAP, base=0.05), config.redis_retries),
    }
    if config.redis_password:
        options["password"] = config.redis_password
    tls = ssl_options(config.redis_ssl)
    url = config.redis_url
    scheme = urlsplit(url).scheme
    if scheme.endswith(CLUSTER_SUFFIX):
        if tls is not None:
            options.update(ssl=True, **tls)
        return RedisCluster.from_url(url.replace(CLUSTER_SUFFIX, "", 1), **options)
    options.update(retry_on_error=_RETRY_ON)
    if scheme == SENTINEL_SCHEME:
        return _sentinel_master(config, options, tls)
    if tls is not None:
        options.update(connection_class=SSLConnection, **tls)
    return StoreRedis.from_url(url, **options)


def resend_window_ms(config: DelayQConfig) -> float:
    """How long after a call redis-py may still send it again (its reply lost): each try
    waits up to the socket timeout, and the backoff before the next up to 1 s."""
    return 1000 * (config.redis_retries + 1) * (config.redis_socket_timeout + _BACKOFF_CAP)


class StoreRedis(redis.Redis):
    """redis-py's client of one Redis server, keeping a connection of its pool at hand for
    script calls (``EVALSHA``): a call that finds it free uses it directly, without the
    pool's checkout and return (a one-job ``apply_delayed`` runs ~1.15 times as fast), and
    its command packed by hiredis (:func:`packed`, ~1.07 times as fast again). A call
    that finds it taken (by another thread's call) goes through the pool.

    The call is what the pool's path makes it: the connection is checked as the pool checks
    one it hands out (data waiting on it, or a connection the server closed, is dropped
    first), a connection error or timeout drops it and is retried as the client's ``retry``
    says, and a process forked from this one takes a connection of its own.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._at_hand_lock = threading.Lock()
        self._at_hand: Any = None  # a connection of the pool, never returned to it
        self._at_hand_pid = os.getpid()

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        if not self._at_hand_lock.acquire(blocking=False):  # another thread's call has it
            return super().evalsha(sha, numkeys, *keys_and_args)
        try:
            connection = self._connection_at_hand()
            return connection.retry.call_with_retry(
                lambda: self._ask(connection, "EVALSHA", sha, numkeys, *keys_and_args),
                lambda _error: connection.disconnect())
        finally:
            self._at_hand_lock.release()

    def _connection_at_hand(self) -> Any:
        if self._at_hand is None or self._at_hand_pid != os.getpid():
            # after a fork the parent's connection is left alone, as the pool leaves it
            self._at_hand = self.connection_pool.get_connection(*GET_CONNECTION_ARGS)
            self._at_hand_pid = os.getpid()
        elif _stale(self._at_hand):
            self._at_hand.disconnect()  # the send connects it again
        return self._at_hand

    def _ask(self, connection: Any, *command: Any) -> Any:
        connection.send_packed_command(packed(connection, command))
        return self.parse_response(connection, command[0])


def packed(connection: Any, command: tuple[Any, ...]) -> Any:
    """``command`` in Redis's protocol, packed by hiredis in one C call when it can: the
    bytes redis-py packs, which first encodes each argument in Python (a one-job schedule
    call's 24 took ~16 µs of its ~230). redis-py packs what hiredis refuses: all with
    hiredis < 2.1, a string with a surrogate (an id read back from bytes, which
    ``encoding_errors`` escapes), a value redis-py rejects (it raises)."""
    if _PACK is not None:
        try:
            return [_PACK(command)]
        except (TypeError, UnicodeEncodeError):
            pass
    return connection.pack_command(*command)


def _stale(connection: Any) -> bool:
    """Whether an idle connection has something to read: a reply left unread, or the end
    of a connection the server closed (which redis-py raises). One not connected has not:
    the send connects it (``can_read`` would connect it first, a second wait on a server
    that is down)."""
    if getattr(connection, "_sock", None) is None:
        return False
    try:
        return bool(connection.can_read())
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return True


def follow_cluster(client: redis.Redis | RedisCluster | None) -> None:
    """After a call failed on a Redis Cluster, ask it again which node serves which slots:
    a replica may have taken over a master that died. redis-py does it for its own
    commands; the store's pipelines per node and pub/sub connections need it done. Best
    effort: when no node answers yet, the map stays as it was until the next failure."""
    if isinstance(client, RedisCluster):
        with contextlib.suppress(redis.RedisError, RedisClusterException):
            client.nodes_manager.initialize()


class SentinelMaster(redis.Redis):
    """The master a Sentinel set names; connections follow it across failovers (a
    ``READONLY`` reply or a lost connection makes them ask the Sentinels again)."""

    connection_pool: SentinelConnectionPool

    def close(self) -> None:
        super().close()
        for sentinel in self.connection_pool.sentinel_manager.sentinels:  # no Sentinel.close
            sentinel.close()                                               # before redis-py 7


class _MasterConnection(SentinelManagedConnection):
    """redis-py's Sentinel connection, which reconnects on a ``READONLY`` reply, made to
    do so when the reply comes from inside a script too (Redis 6.2 runs a writing script
    on a replica until its first write: ``ERR Error running script ... -READONLY``).
    Nothing was written then, so the call is safe to retry on the new master."""

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)
        except ResponseError as exc:
            if not (self.connection_pool.is_master and "-READONLY " in str(exc)):
                raise
            self.disconnect()
            raise redis.ConnectionError("the master became a replica (failover)") from exc


class _MasterSSLConnection(_MasterConnection, SSLConnection):
    pass


def _sentinel_master(config: DelayQConfig, options: dict[str, Any],
                     tls: dict[str, Any] | None) -> SentinelMaster:
    nodes, master = sentinel_nodes(config.redis_url)
    transport = config.redis_transport_options
    master["connection_class"] = _MasterConnection if tls is None else _MasterSSLConnection
    master.update(tls or {})
    # One try per Sentinel: asking the next one is the retry (redis-py's default would
    # back off for seconds on each). The master's connections retry as configured.
    asking = {"socket_timeout": options["socket_timeout"], "retry": Retry(NoBackoff(), 0),
              "socket_connect_timeout": options["socket_connect_timeout"],
              **transport.get("sentinel_kwargs", {})}
    sentinel = Sentinel(nodes, min_other_sentinels=int(transport.get("min_other_sentinels", 0)),
                        sentinel_kwargs=asking, **options)
    return sentinel.master_for(transport["master_name"], redis_class=SentinelMaster, **master)


def sentinel_nodes(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The Sentinels of a ``sentinel://`` URL and the master's options (db, username,
    password, query options) given in any of its ``;``-separated parts."""
    nodes: list[tuple[str, int]] = []
    master: dict[str, Any] = {}
    for part in url_list(url):
        options = _parsed("redis" + part.removeprefix(SENTINEL_SCHEME), part)
        nodes.append((options.pop("host", "127.0.0.1"), options.pop("port", SENTINEL_PORT)))
        for name, value in options.items():
            if master.setdefault(name, value) != value:
                raise ConfigurationError(
                    f"the parts of delayq_redis_url give two values of {name!r}; give it once")
    return nodes, master


def check_readable(url: str) -> None:
    """Raise :class:`ConfigurationError` when redis-py cannot read the store's URL, or would
    read it as another server than it names: a ``/``, ``?`` or ``#`` left as it is in a
    password ends its userinfo early (an ``@`` in the query reads alike: refused too).
    redis-py's own error quotes the text before that character (part of the password), or
    it reads another server with no password (``redis://:1234/x@h`` is port 1234 on
    localhost); this error shows the URL redacted."""
    for part in url_list(url):
        try:
            parts = urlsplit(part)
            userinfo = _USERINFO.match(part)
            if userinfo and userinfo["userinfo"] != parts.netloc.rpartition("@")[0]:
                raise ValueError  # an "@" after the userinfo's end, which redact hides
            if parts.scheme != SENTINEL_SCHEME:
                _parsed(redis_py_url(part).replace(CLUSTER_SUFFIX, "", 1), part)
        except ValueError:
            raise _unreadable(part) from None
        read = urlsplit(redis_py_url(part))  # (kombu's socket URL: unix://, a path)
        if not read.scheme.startswith("unix") and not _DATABASE.fullmatch(read.path):
            raise ConfigurationError(
                f"the store's Redis URL {redact(part)!r} (delayq_redis_url, else the broker "
                f"URL) names the database {unquote(read.path[1:])!r}: give its number, as in "
                "redis://host:6379/1 (redis-py reads /db1 as database 0 and /1/2 as 12)")


#: The path of a store URL: no database (0), or its number.
_DATABASE = re.compile(r"/?|/[0-9]+")


def _parsed(url: str, shown: str) -> dict[str, Any]:
    """redis-py's reading of ``url``; ``shown``, redacted, names it in the error."""
    try:
        return parse_url(url)
    except ValueError:
        raise _unreadable(shown, _wrong_past_userinfo(url)) from None


def _wrong_past_userinfo(url: str) -> str:
    """What redis-py finds wrong in ``url`` with its userinfo taken out (so its words hold
    no part of a password); "" when that reads: then the userinfo is what it cannot read."""
    try:
        parse_url(_USERINFO.sub(lambda found: found["scheme"] or "", url, count=1))
    except ValueError as exc:
        return str(exc)
    return ""


def _unreadable(url: str, wrong: str = "") -> ConfigurationError:
    """The error of a store URL redis-py cannot read: ``wrong`` (redis-py's words on a part
    past the userinfo), else the advice to percent-encode the user name and password."""
    where = (f"cannot read the store's Redis URL {redact(url)!r} (delayq_redis_url, else the "
             "broker URL)")
    if wrong:
        return ConfigurationError(f"{where}: {wrong.rstrip('.')}; fix that part of the URL "
                                  "(redis-py's from_url documents its query options)")
    return ConfigurationError(
        f"{where}: percent-encode the characters / ? # @ : % [ ] in its user name and "
        "password (urllib.parse.quote(password, safe='')), and @ in its query, or set the "
        "password in delayq_redis_password instead")


#: kombu's scheme of a Redis server on a Unix socket: redis+socket:///path?virtual_host=N.
KOMBU_SOCKET = "redis+socket"


def redis_py_url(url: str) -> str:
    """The URL as redis-py reads it: kombu's ``redis+socket:///path?virtual_host=N`` (a
    broker URL Celery's docs give for a Unix socket) as ``unix:///path?db=N``; any other
    URL as it is."""
    parts = urlsplit(url)
    if parts.scheme != KOMBU_SOCKET:
        return url
    query = urlencode([("db" if name == "virtual_host" else name, value)
                       for name, value in parse_qsl(parts.query, keep_blank_values=True)])
    return f"unix://{parts.netloc}{parts.path}{'?' if query else ''}{query}"


def check_settings(config: DelayQConfig) -> None:
    """Raise :class:`ConfigurationError` if the URL's scheme or connection options are wrong."""
    scheme = urlsplit(config.redis_url).scheme
    if scheme == SENTINEL_SCHEME:
        if any(not p.startswith(f"{SENTINEL_SCHEME}://") for p in url_list(config.redis_url)):
            raise ConfigurationError(
                "every part of a sentinel delayq_redis_url must be sentinel://host:port, "
                f"separated by ';'; got {redact(config.redis_url)!r}")
        if not config.redis_transport_options.get("master_name"):
            raise ConfigurationError(
                "a sentinel:// store needs the name of its master: set "
                "delayq_redis_transport_options = {'master_name': 'mymaster'} (a store on the "
                "broker URL takes it from broker_transport_options)")
        _check_sentinel_options(config.redis_transport_options)
        sentinel_nodes(config.redis_url)
    elif scheme.removesuffix(CLUSTER_SUFFIX) not in ("redis", "rediss", "unix") or (
            scheme == "unix" + CLUSTER_SUFFIX):
        raise ConfigurationError(
            "delayq_redis_url must be a redis://, rediss:// or unix:// URL, "
            "redis+cluster:// / rediss+cluster:// for a Redis Cluster, or "
            "sentinel://host:26379;sentinel://host2:26379/0 for Redis Sentinel; got "
            f"{redact(config.redis_url)!r}")
    if config.redis_password and holds_password(config.redis_url):
        raise ConfigurationError(
            f"delayq_redis_password is set and the store's URL {redact(config.redis_url)!r} "
            "holds a password too (the URL's would win): keep it in delayq_redis_password "
            "only")
    ssl_options(config.redis_ssl)


def _check_sentinel_options(transport: Mapping[str, Any]) -> None:
    """Refuse ``min_other_sentinels`` that is no whole number >= 0 and ``sentinel_kwargs``
    that are no mapping (they failed at the store's first call)."""
    others = transport.get("min_other_sentinels", 0)
    if isinstance(others, bool) or not str(others).isdigit():
        raise ConfigurationError(
            "min_other_sentinels of delayq_redis_transport_options must be a whole number "
            f">= 0 (how many other Sentinels must agree on the master), got {others!r}")
    if not isinstance(transport.get("sentinel_kwargs", {}), Mapping):
        raise ConfigurationError(  # (its text may hold a password: not shown)
            "sentinel_kwargs of delayq_redis_transport_options must be a mapping of options "
            "of the Sentinel connections (e.g. {'password': ...}), got a "
            f"{type(transport['sentinel_kwargs']).__name__}")


def ssl_options(options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """redis-py's TLS keyword arguments from ``delayq_redis_ssl`` / ``broker_use_ssl`` (None:
    no TLS beyond what the URL asks for). ``ssl_cert_reqs`` may be an ``ssl.CERT_*``
    constant, its name, or redis-py's ``none`` / ``optional`` / ``required``."""
    if options is None:
        return None
    unknown = sorted(name for name in options if not name.startswith("ssl_"))
    if unknown:
        raise ConfigurationError(
            f"TLS options of a Redis store take redis-py's ssl_* names (ssl_cert_reqs, "
            f"ssl_ca_certs, ssl_certfile, ssl_keyfile, ...), as broker_use_ssl does for a Redis "
            f"broker; got {unknown}")
    tls = dict(options)
    reqs = tls.get("ssl_cert_reqs")
    if isinstance(reqs, str):
        tls["ssl_cert_reqs"] = _CERT_REQS.get(reqs.upper(), reqs.lower())
    return tls


# -- printing URLs -----------------------------------------------------------------------

_NEXT_URL = re.compile(r";(?=[A-Za-z][A-Za-z0-9+.-]*://)")
_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)?(?P<userinfo>.*)@", re.DOTALL)
#: A name (of a query parameter, an option) that says its value is a secret.
SECRET_NAME = re.compile(r"pass|secret|token|auth|credential", re.I)
_PARAM = re.compile(r"(?P<name>[?&;][^=&;#]*=)(?P<value>[^&;#]*)")
_PLAIN_USER = re.compile(r"[\w.~%+-]*")


def url_list(url: str) -> list[str]:
    """The URLs of a ``;``-separated list (Sentinels, or failover brokers)."""
    return _NEXT_URL.split(url)


def redact(url: object) -> str:
    """The URL (or list of URLs) with every password replaced by ``***``: in the userinfo
    and in query parameters such as ``?password=``. Safe to log, raise and print."""
    if isinstance(url, (list, tuple)):
        url = ";".join(map(str, url))
    return ";".join(_redact_one(part) for part in url_list(str(url)))


def holds_password(url: str) -> bool:
    """True when the URL (or one of its ``;``-separated URLs) holds a password: after the
    user name of its userinfo, or in a query parameter such as ``?password=``."""
    for part in url_list(url):
        match = _USERINFO.match(part)
        if match is not None and match["userinfo"].partition(":")[2]:
            return True
        if any(found["value"] for found in _secret_params(part)):
            return True
    return False


def _secret_params(url: str) -> list[re.Match[str]]:
    """The query parameters of ``url`` named as secrets, read as redis-py reads their names
    (percent-decoded: ``?p%61ssword=`` is a password)."""
    return [found for found in _PARAM.finditer(url) if SECRET_NAME.search(unquote(found["name"]))]


def _redact_one(url: str) -> str:
    match = _USERINFO.match(url)
    if match is not None:
        userinfo = match["userinfo"]
        if "?" in userinfo or "#" in userinfo:  # no telling the query from a password
            return f"{match['scheme'] or ''}***"
        user, colon, _ = userinfo.partition(":")
        shown = f"{user}:***" if colon and _PLAIN_USER.fullmatch(user) else "***"
        url = f"{match['scheme'] or ''}{shown}@{url[match.end():]}"
    for found in reversed(_secret_params(url)):
        url = f"{url[:found.start('value')]}***{url[found.end('value'):]}"
    return url
