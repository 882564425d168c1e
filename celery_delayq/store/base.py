"""What every part of :class:`~celery_delayq.store.Store` stands on: its Redis client, the
store's record of itself (``meta``: its shard count, format and default queue, checked,
and an id that changes only when the store is made again; written by a process's first
write, never by its reads), the translation of Redis errors into ours, and the store's
memory (read only)."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Iterator
from functools import cached_property
from itertools import islice
from typing import Any, cast

import redis
from redis.client import PubSub
from redis.cluster import RedisCluster
from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    RedisClusterException,
    TryAgainError,
)

from ..conf import DelayQConfig
from ..connection import connect, follow_cluster, redact
from ..errors import ConfigurationError, DamagedShard, DelayQError, StoreFull, StoreUnavailable
from ..keys import Keyspace, ShardKeys, pack_id, raw_id
from ..memory import Headroom, Memory, refused_for_memory
from ..persistence import Persistence
from ..reading import count_of, printable
from ..scripts import SCRIPTS, Script

_NETWORK_ERRORS = (redis.ConnectionError, redis.TimeoutError, ClusterDownError)
_DAMAGED = "DAMAGED "  # how a script's error says one of its keys holds the wrong type
#: How Redis 6.2 and 7 word the ACL's refusal of a command a script calls (no NOPERM).
_SCRIPT_REFUSED = "The user executing the script can't run this command"
#: Redis's refusal of an XADD to a stream whose last id is the largest there is (a journal
#: given that id by hand): the event is left out and the call goes on (journal.lua).
_NO_STREAM_ID = "exhausted the last possible ID"
SCAN_CHUNK = 500  # members / fields read per command when a reader scans a key
#: The description of its client a Sentinel's "No master found for 'm' : <...> - " holds
#: (redis-py 8: a kilobyte of pool and connection options; 5: ``Redis<ConnectionPool<…>>>``).
_CLIENT_SHOWN = re.compile(r" : \S*<.*> - ", re.S)
#: The layout of the store's keys and values this version reads and writes (``meta``'s
#: ``format``). A release that changes it raises it and says how to move a store on; a
#: process refuses a store of a format it does not know, rather than misread its jobs.
FORMAT = 1
_META_FIELDS = ("shards", "format", "id", "queue")


def chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """``items`` (e.g. a scan) in lists of ``size``, the last one shorter."""
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


def raised(replies: list[Any]) -> list[Any]:
    """``replies`` of script calls (or commands), once none is an error (else the first is
    raised); a journal's refusal for want of a stream id is none."""
    failed = next((reply for reply in replies if isinstance(reply, Exception)
                   and _NO_STREAM_ID not in str(reply)), None)
    if failed is not None:
        raise failed
    return replies


class StoreBase:
    """The client, configuration and key names the parts of ``Store`` share."""

    def __init__(self, config: DelayQConfig) -> None:
        self.config = config
        self.keys = Keyspace(config.prefix, config.shards)
        self._maxlen = config.journal_maxlen
        self._reading: redis.Redis | RedisCluster | None = None  # see ``reader``

    def answer_key(self, shard: ShardKeys) -> str:
        """A key of its own for one call that keeps its reply (``answer.lua``)."""
        return self.keys.answer(shard, os.urandom(9).hex())

    def unindex_call(self, shard: ShardKeys, jobs: list[tuple[str, str]]
                     ) -> tuple[Script, list[str], list[Any]]:
        """The ``unindex`` call that forgets, on ``shard``, the task id index of each of
        ``jobs`` (stored job id, a task id the job has no longer)."""
        script = SCRIPTS["unindex"]
        return (script, script.keys_for(shard, *(self.keys.task_index(shard, pack_id(task_id))
                                                 for _, task_id in jobs)),
                [value for stored, task_id in jobs for value in (raw_id(stored), task_id)])

    # -- connection --------------------------------------------------------------------

    @cached_property
    def client(self) -> redis.Redis | RedisCluster:
        """A client of the store (plain, cluster or Sentinel: see :mod:`connection`), its
        record written where it lacks a field; the :attr:`reader`'s, once there is one."""
        with self.unavailable():
            client = connect(self.config) if self._reading is None else self._reading
            self._check_meta(client)
        self._reading = None
        return client

    @property
    def reader(self) -> redis.Redis | RedisCluster:
        """The client reads use: :attr:`client` once open, else one that checks the
        store's record without writing it (a process that only reads writes nothing)."""
        if "client" in self.__dict__:
            return self.client
        if self._reading is None:
            with self.unavailable():
                client = connect(self.config)
                self._check_meta(client, record=False)
            self._reading = client
        return self._reading

    def _check_meta(self, client: redis.Redis | RedisCluster,
                    record: bool = True) -> dict[str, str | None]:
        """Refuse a store of another shard count, format or default queue; ``meta``'s
        fields, with ``record`` those it lacked written first (a new store, one of an older
        version, or one whose Redis lost its data). A read while the record is whole; a full
        Redis that refuses the write does not stop a start (a later write records them)."""
        fields = self._read_meta(client)
        self._same_meta(fields)
        if record and None in fields.values():
            try:
                for name, value in (("shards", self.keys.shards), ("format", FORMAT),
                                    ("id", os.urandom(8).hex()),
                                    ("queue", self.config.default_queue)):
                    if fields[name] is None:
                        client.hsetnx(self.keys.meta, name, value)
            except redis.ResponseError as exc:
                if not refused_for_memory(exc):
                    raise
            fields = self._read_meta(client)
            self._same_meta(fields)
        return fields

    def _read_meta(self, client: redis.Redis | RedisCluster) -> dict[str, str | None]:
        """``meta``'s fields, None where missing: one HMGET."""
        return dict(zip(_META_FIELDS, cast("list[str | None]", client.hmget(
            self.keys.meta, _META_FIELDS)), strict=True))

    def _same_meta(self, fields: dict[str, str | None]) -> None:
        """Raise ConfigurationError unless ``meta`` records a format this version knows and
        this app's shard count and default queue (or none)."""
        self._known_format(fields["format"])
        self._same_shards(fields["shards"])
        self._same_default_queue(fields["queue"])

    def _known_format(self, stored: str | None) -> None:
        if stored is None or count_of(stored) == FORMAT:
            return
        meta, found = self.keys.meta, count_of(stored)
        if found is not None and found > FORMAT:
            raise ConfigurationError(
                f"the store under prefix {self.keys.prefix!r} is of store format {found} "
                f"({meta} field 'format'), written by a newer celery-delayq; this one knows "
                f"format {FORMAT}: upgrade celery-delayq in this process (every producer, "
                "carrier and worker of a store needs a version that knows its format; "
                "docs/operations.md, 'Upgrading')")
        raise ConfigurationError(
            f"{meta} field 'format' holds {printable(stored)!r}, not a store format this "
            f"celery-delayq knows ({FORMAT}); if it was changed by hand, set it back "
            f"(HSET {meta} format {FORMAT}) before using the store")

    def _same_shards(self, stored: str | None) -> None:
        """Raise ConfigurationError unless ``meta`` records this app's shard count (or none)."""
        if stored is None:
            return
        shards = count_of(stored)
        meta = self.keys.meta
        if shards is None:
            raise ConfigurationError(
                f"{meta} field 'shards' holds {printable(stored)!r}, not a shard count; it "
                "records the delayq_shards the store was made with: set it back "
                f"(HSET {meta} shards N) before using the store")
        if shards != self.keys.shards:
            raise ConfigurationError(
                f"the store under prefix {self.keys.prefix!r} records delayq_shards={shards} "
                f"({meta}), this app says {self.keys.shards}; give every process of the store "
                "the same value (or this app a new delayq_prefix) so every job can be found. "
                "The first process that finds the record missing (a new store, or one whose "
                f"Redis lost its data) writes it: if {shards} is wrong, stop the processes "
                f"configured with it, then HSET {meta} shards {self.keys.shards}")

    def _same_default_queue(self, stored: str | None) -> None:
        """Raise ConfigurationError unless ``meta`` records this app's ``task_default_queue``
        (or none): a job sent to its producer's default queue is stored without its queue,
        and a carrier publishes it to the default queue."""
        if stored is None or stored == self.config.default_queue:
            return
        meta = self.keys.meta
        raise ConfigurationError(
            f"the store under prefix {self.keys.prefix!r} records "
            f"task_default_queue={printable(stored)!r} ({meta} field 'queue'), this app says "
            f"{self.config.default_queue!r}; a job sent to the default queue would reach the "
            "other one. Give every producer, carrier and worker of the store the same "
            "task_default_queue (CELERY_TASK_DEFAULT_QUEUE in Django settings), or this app "
            "a new delayq_prefix. If the record is wrong, stop the processes configured with "
            f"it, then HSET {meta} queue {self.config.default_queue}")

    def store_id(self) -> str | None:
        """The id ``meta`` holds, read with its shard count, format and default queue (which
        are checked, as at the client's creation): one HMGET. A record missing any is
        written first, so another id than the one read before means the store was made
        again. None while a full Redis refuses that write."""
        with self.unavailable():
            return self._check_meta(self.client)["id"]

    @contextlib.contextmanager
    def unavailable(self) -> Iterator[None]:
        """Turn Redis network errors into :class:`StoreUnavailable` with a safe URL, a write
        refused for memory into :class:`StoreFull`, a key of the wrong type into
        :class:`DamagedShard`, and a refusal that needs the operator (a read-only replica, a
        command the ACL user lacks) into an error that says what to do."""
        try:
            yield
        except RedisClusterException as exc:  # not a RedisError; from the cluster client
            raise self._cluster_error(exc) from exc
        except ClusterError as exc:  # redis-py's cluster client gave up ("TTL exhausted")
            raise StoreUnavailable(
                f"Redis Cluster at {redact(self.config.redis_url)} kept refusing the call "
                f"({exc}): a slot of the store may be moving to another node (resharding) "
                "or failing over; retry") from exc
        except BusyLoadingError as exc:
            raise StoreUnavailable(
                f"Redis at {redact(self.config.redis_url)} is loading its data into memory "
                "after a restart and refuses commands until it has (`INFO persistence`, "
                "loading_loaded_perc, says how far it is); retry in a moment") from exc
        except redis.AuthenticationError as exc:  # a ConnectionError, but the server is up
            raise StoreUnavailable(
                f"Redis at {redact(self.config.redis_url)} refused the credentials ({exc}): "
                "give the store's password in delayq_redis_password "
                "(CELERY_DELAYQ_REDIS_PASSWORD in Django settings) or in its URL, and the "
                "ACL user name in the URL (redis://USER@host) if it has ACL users") from exc
        except _NETWORK_ERRORS as exc:
            follow_cluster(self.__dict__.get("client"))  # (None while it is being made)
            raise StoreUnavailable(
                f"Redis at {redact(self.config.redis_url)} is unavailable after "
                f"{self.config.redis_retries} retries ({_CLIENT_SHOWN.sub(': ', str(exc))}); "
                "check that it runs and that delayq_redis_url points at it"
            ) from exc
        except redis.ResponseError as exc:
            if str(exc).startswith(_DAMAGED):
                raise DamagedShard(str(exc)) from exc
            if "WRONGTYPE" in str(exc):  # a plain command (a read) met a damaged key
                raise DamagedShard(f"a key of the store holds another type of value ({exc}); "
                                   "`celery -A proj delayq health` names it") from exc
            if moving_slot(exc):
                raise slot_moving(exc, redact(self.config.redis_url)) from exc
            for_now = refused_for_now(exc, redact(self.config.redis_url))
            if for_now is not None:
                raise for_now from exc
            if str(exc).startswith("DB index is out of range"):
                raise ConfigurationError(
                    f"Redis at {redact(self.config.redis_url)} has no such database (the "
                    "number after the last /): its `databases` setting is lower; give "
                    "delayq_redis_url (or the broker URL) a database below it, such as /0"
                ) from exc
            if refused_for_memory(exc):
                self.headroom.refused()
                raise StoreFull(f"Redis at {redact(self.config.redis_url)} refused a write: "
                                "it is at its maxmemory") from exc
            if isinstance(exc, redis.exceptions.ReadOnlyError) or "-READONLY " in str(exc):
                raise StoreUnavailable(
                    f"Redis at {redact(self.config.redis_url)} is a read-only replica and "
                    f"refused a write ({exc}); point delayq_redis_url at its master (a "
                    "failover may have demoted it: a sentinel:// URL follows the master)"
                ) from exc
            if refused_by_acl(exc):
                raise acl_refusal(exc, redact(self.config.redis_url)) from exc
            raise

    def _cluster_error(self, exc: RedisClusterException) -> DelayQError:
        """What a cluster client that could not read the slot map met, as ours: a command
        the ACL refused, a node not in cluster mode, else no node to ask (unavailable)."""
        url = redact(self.config.redis_url)
        causes = []
        cause: BaseException | None = exc
        while cause is not None:
            causes.append(cause)
            cause = cause.__cause__ or cause.__context__
        refusal = next((c for c in causes if refused_by_acl(c)), None)
        if refusal is not None:
            return ConfigurationError(
                f"Redis Cluster at {url} refused the store's user a command its cluster "
                f"client needs ({refusal}); on a cluster every user also needs "
                "+cluster|slots +command, besides its line in docs/operations.md under "
                "'Redis ACL users'")
        if any(str(c) == "Cluster mode is not enabled on this node" for c in causes):
            return ConfigurationError(
                f"delayq_redis_url {url} names a Redis Cluster, but the server there is "
                "not a cluster node; for one Redis server use a redis:// (or rediss://) "
                "URL, without +cluster")
        return StoreUnavailable(
            f"Redis Cluster at {url} is unavailable ({exc}); check that its nodes run and "
            "that delayq_redis_url names one of them")

    def now_ms(self) -> int:
        """Redis's clock, in ms: the clock every due time follows."""
        seconds, micros = self.reader.time()
        return seconds * 1000 + micros // 1000

    def subscribe(self, channel: str) -> PubSub:
        """A pub/sub connection subscribed to ``channel`` (the carrier's wake channel)."""
        with self.unavailable():
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(channel)
            except BaseException:
                pubsub.close()
                raise
        return pubsub

    def close(self) -> None:
        if "client" in self.__dict__:
            self.client.close()
            del self.__dict__["client"]
        if self._reading is not None:
            self._reading.close()
            self._reading = None

    # -- memory (read-only) ------------------------------------------------------------

    @cached_property
    def headroom(self) -> Headroom:
        """Producers' gate: StoreFull past ``delayq_max_memory_fraction`` of maxmemory."""
        return Headroom(self.config.max_memory_fraction, self.memory,
                        redact(self.config.redis_url))

    def memory(self) -> list[Memory]:
        """INFO memory of the store's Redis (of each primary on a cluster)."""
        return [Memory.from_info(info) for info in self._info("memory")]

    def persistence(self) -> list[Persistence]:
        """INFO persistence of the store's Redis (of each primary on a cluster)."""
        return [Persistence.from_info(info) for info in self._info("persistence")]

    def _info(self, section: str) -> list[dict]:
        with self.unavailable():
            client = self.reader
            if isinstance(client, RedisCluster):
                infos = client.info(section, target_nodes=RedisCluster.PRIMARIES)
                return list(infos.values())
            return [client.info(section)]

    def eviction_policies(self) -> list[str]:
        """``maxmemory-policy`` of the store's Redis (each primary): CONFIG GET, or INFO
        memory where CONFIG is refused (renamed, ACL); "" where neither says."""
        with self.unavailable():
            client = self.reader
            try:
                if isinstance(client, RedisCluster):
                    replies = cast(  # one reply per node (redis-py types one node's)
                        "dict[str, dict[str, str]]",
                        client.config_get("maxmemory-policy",
                                          target_nodes=RedisCluster.PRIMARIES))
                    return [reply.get("maxmemory-policy", "") for reply in replies.values()]
                return [client.config_get("maxmemory-policy").get("maxmemory-policy") or ""]
            except redis.ResponseError:  # CONFIG renamed, or not granted to the store's user
                pass
        return [memory.policy for memory in self.memory()]


def refused_by_acl(exc: BaseException) -> bool:
    """True for the ACL's refusal of a command: NoPermissionError (NOPERM), or of a command
    a script calls ("The user executing the script can't run this command")."""
    return isinstance(exc, redis.exceptions.NoPermissionError) or "NOPERM " in str(exc) \
        or _SCRIPT_REFUSED in str(exc)


def moving_slot(exc: Exception) -> bool:
    """True for a cluster node's ``TRYAGAIN``: the call's keys are split between two nodes
    while their slot moves (resharding); it did not run."""
    return isinstance(exc, TryAgainError) or str(exc).startswith(
        "Multiple keys request during rehashing")


#: Refusals Redis makes while a condition lasts (the reply's code, as Redis 7 words it;
#: Redis 6.2 puts a script's inside its own error as "-CODE ..."), and what they mean.
_WAIT_FOR = {
    "BUSY": "is busy running a script and refuses every command until it ends; retry then "
            "(the carrier does). The store's own scripts do bounded work (docs/reliability.md, "
            "'Calls that could block Redis'): a script that runs this long is another "
            "client's; SCRIPT KILL stops it if it has written nothing",
    "NOREPLICAS": "refuses writes while fewer replicas than its min-replicas-to-write are "
                  "connected and in sync; a refused call writes nothing: retry once they are "
                  "back (INFO replication lists them)",
    "MISCONF": "failed to write its RDB snapshot and refuses writes until one succeeds "
               "(stop-writes-on-bgsave-error); a refused call writes nothing: its log says "
               "why (a full disk, a directory it cannot write); retry once it saves",
}


def refused_for_now(exc: Exception, url: str = "") -> StoreUnavailable | None:
    """The error of a call Redis refused while a condition lasts (``BUSY``, ``NOREPLICAS``,
    ``MISCONF``), else None (``url``: redacted)."""
    text = str(exc)  # (in a pipeline: "Command # 1 (...) of pipeline caused error: BUSY ...")
    for code, meaning in _WAIT_FOR.items():
        if text.startswith(f"{code} ") or f"-{code} " in text or f"error: {code} " in text:
            return StoreUnavailable(f"Redis{f' at {url}' if url else ''} {meaning} ({exc})")
    return None


def slot_moving(exc: Exception, url: str = "") -> StoreUnavailable:
    """The error of a call refused with ``TRYAGAIN`` (``url``: redacted)."""
    return StoreUnavailable(
        f"Redis Cluster{f' at {url}' if url else ''} is moving a slot of the store to "
        f"another node (resharding) and refused a call on it ({exc}), which wrote nothing: "
        "retry (the carrier does) once the move is done")


def acl_refusal(exc: Exception, url: str = "") -> ConfigurationError:
    """The error of a command the ACL refused the store's user (``url``: redacted)."""
    return ConfigurationError(
        f"Redis{f' at {url}' if url else ''} refused the store's user a command ({exc}); "
        "give that user the commands docs/operations.md lists under 'Redis ACL users'")


def damaged_key(key: str, holds: str, exc: Exception) -> DelayQError:
    """The error of a plain command on ``key`` (which should hold a ``holds``): a
    :class:`DamagedShard` naming it for ``WRONGTYPE``, else as :func:`shard_error`."""
    if "WRONGTYPE" in str(exc):
        return DamagedShard(f"{key} holds another type of value, not a {holds}")
    return shard_error(exc)


def shard_error(exc: Exception) -> DelayQError:
    """What a failed script call on one shard means to its caller."""
    if str(exc).startswith(_DAMAGED):
        return DamagedShard(str(exc))
    if refused_by_acl(exc):
        return acl_refusal(exc)
    if moving_slot(exc):
        return slot_moving(exc)
    return refused_for_now(exc) or DelayQError(f"Redis refused the call: {exc}")
