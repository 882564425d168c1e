"""The Lua scripts of the store, loaded once from the ``.lua`` files beside this module.

A file ``name-N.lua`` is the script ``name`` taking exactly ``N`` keys (``name-N+.lua``:
at least ``N``); its header documents each ``KEYS[i]`` and ``ARGV[i]``. Each header line
``KEYS[i] <name> <TYPE> ...`` (i up to ``N``) names the :class:`~celery_delayq.keys.ShardKeys`
field that is ``KEYS[i]``, so :meth:`Script.keys_for` builds the keys of a call on one shard
from the header (``reserve``'s keys are reservation keys, not a shard's: it is called with
its keys given). A line ``-- include: file.lua`` is replaced by ``include/file.lua`` (Lua
shared by several scripts), once per script however often it is asked for (an include may
include others).
Scripts are called by SHA and loaded into Redis on the first ``NOSCRIPT`` (a restarted
Redis forgets them).
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from dataclasses import dataclass, fields
from importlib import resources
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import AskError, MovedError, NoScriptError, ResponseError

from ..connection import GET_CONNECTION_ARGS, follow_cluster
from ..keys import ShardKeys

_FILE = re.compile(r"^(?P<name>[a-z_]+)-(?P<keys>\d+)(?P<more>\+?)\.lua$")
_INCLUDE = re.compile(r"^-- include: (?P<file>[a-z_]+\.lua)$", re.M)
_HEADER_KEY = re.compile(r"^KEYS\[(?P<n>\d+)\]\s+(?P<name>\w+)", re.M)
#: The names of a shard's keys (the ShardKeys fields that hold a key name).
SHARD_KEYS = frozenset(f.name for f in fields(ShardKeys)) - {"shard"}


@dataclass(frozen=True)
class Script:
    name: str
    numkeys: int  # the least number of keys it takes
    variadic: bool  # takes more keys than numkeys
    source: str
    sha: str
    #: the ShardKeys field of each KEYS[1..numkeys], as the header names them; None for a
    #: script whose keys are not a shard's (reserve)
    shard_keys: tuple[str, ...] | None

    def keys_for(self, shard: ShardKeys, *extra: str) -> list[str]:
        """The keys of a call on ``shard``: the shard's keys the header names for
        ``KEYS[1..numkeys]``, in its order, then ``extra`` (a ``name-N+`` script's keys past
        ``N``, e.g. claim_due's broker lists)."""
        if self.shard_keys is None:
            raise TypeError(f"script {self.name} takes no shard keys: give its keys")
        return [*(getattr(shard, name) for name in self.shard_keys), *extra]

    def call(self, client, keys: list[str], args: list[Any]) -> Any:
        """Run the script on ``client`` (loading it first if Redis does not know it)."""
        self.check(keys)
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            client.script_load(self.source)
            return client.evalsha(self.sha, len(keys), *keys, *args)

    def queue(self, pipe, keys: list[str], args: list[Any]) -> None:
        """Add a call to a pipeline; :func:`execute` loads missing scripts."""
        pipe.execute_command(*self.command(keys, args))

    def command(self, keys: list[str], args: list[Any]) -> tuple[Any, ...]:
        """The ``EVALSHA`` command of a call."""
        self.check(keys)
        return ("EVALSHA", self.sha, len(keys), *keys, *args)

    def check(self, keys: list[str]) -> None:
        if len(keys) < self.numkeys or (len(keys) > self.numkeys and not self.variadic):
            raise TypeError(f"script {self.name} takes {self.numkeys}{'+' if self.variadic else ''}"
                            f" keys, got {len(keys)}")


def _load() -> dict[str, Script]:
    scripts = {}
    folder = resources.files(__package__)
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            text, numkeys = entry.read_text(), int(match["keys"])
            source = _expand(text, folder / "include", set())
            scripts[match["name"]] = Script(
                name=match["name"],
                numkeys=numkeys,
                variadic=bool(match["more"]),
                source=source,
                sha=hashlib.sha1(source.encode()).hexdigest(),
                shard_keys=_shard_keys(match["name"], text, numkeys),
            )
    return scripts


def _expand(text: str, folder: Any, done: set[str]) -> str:
    """``text`` with each ``-- include: file.lua`` line replaced by that file (expanded
    in turn); a file already included is left out."""
    def include(match: re.Match[str]) -> str:
        if match["file"] in done:
            return f"-- (included above: {match['file']})"
        done.add(match["file"])
        return _expand((folder / match["file"]).read_text().rstrip("\n"), folder, done)
    return _INCLUDE.sub(include, text)


def _shard_keys(name: str, text: str, numkeys: int) -> tuple[str, ...] | None:
    """The ShardKeys field of each of a script's first ``numkeys`` keys, from its header;
    None when the header names no shard key there."""
    header = text.split("]]", 1)[0]
    named = {int(m["n"]): m["name"] for m in _HEADER_KEY.finditer(header)}
    names = tuple(named.get(n, "") for n in range(1, numkeys + 1))
    if not any(found in SHARD_KEYS for found in names):
        return None
    wrong = [found for found in names if found not in SHARD_KEYS]
    if wrong:
        raise ImportError(f"script {name}: its header's KEYS name {wrong}, not keys of a "
                          f"shard ({', '.join(sorted(SHARD_KEYS))})")
    return names


SCRIPTS: dict[str, Script] = _load()


def execute(client, calls: list[tuple[Script, list[str], list[Any]]], *,
            raise_errors: bool = True) -> list[Any]:
    """Run script calls in one pipeline round trip (one per node on a cluster).

    Calls that failed with ``NOSCRIPT`` did not run: their scripts are loaded and those
    calls alone are sent again. So did calls a cluster node answered with ``MOVED`` (its
    slots went to another node, e.g. a replica that took over) or ``ASK`` (a slot being
    moved): they are sent again once, to the node the answer names. Any other error of a
    call is raised, or with ``raise_errors=False`` returned in its place.
    """
    return _finish(client, calls, _send(client, calls), raise_errors)


class Deferred:
    """Script calls written to Redis now, their replies read later by :meth:`replies`:
    Redis runs them while the caller does other work.

    The calls hold one pooled connection (per node on a cluster) until then and are not
    retried on a connection error.
    """

    def __init__(self, client, calls: list[tuple[Script, list[str], list[Any]]]) -> None:
        self._client, self._calls = client, calls
        self._sent: list[tuple[Any, Any, list[int]]] = []  # (node client, connection, calls)
        try:
            for node, indexes in _by_node(client, calls):
                connection = node.connection_pool.get_connection(*GET_CONNECTION_ARGS)
                self._sent.append((node, connection, indexes))
                connection.send_packed_command(connection.pack_commands(
                    [calls[i][0].command(calls[i][1], calls[i][2]) for i in indexes]))
        except BaseException:
            self._release(broken=True)
            raise

    def replies(self, raise_errors: bool = True) -> list[Any]:
        """The replies, in order; errors as :func:`execute` has them. Call it once."""
        results: list[Any] = [None] * len(self._calls)
        try:
            for _, connection, indexes in self._sent:
                for index in indexes:
                    try:
                        results[index] = connection.read_response()
                    except ResponseError as exc:
                        results[index] = exc
        except BaseException:
            self._release(broken=True)  # replies left unread would answer the next command
            raise
        self._release(broken=False)
        return _finish(self._client, self._calls, results, raise_errors)

    def _release(self, broken: bool) -> None:
        for node, connection, _ in self._sent:
            if broken:
                connection.disconnect()
            node.connection_pool.release(connection)
        self._sent = []


def _finish(client, calls, results: list[Any], raise_errors: bool) -> list[Any]:
    """Rerun the calls that met ``MOVED`` or ``ASK`` on the node the answer names, then
    those that met ``NOSCRIPT`` after loading their scripts; raise any error (with
    ``raise_errors``)."""
    _follow_redirections(client, calls, results)
    missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
    if missing:
        for script in {calls[i][0] for i in missing}:
            client.script_load(script.source)
        for i, result in zip(missing, _send(client, [calls[i] for i in missing]), strict=True):
            results[i] = result
    for result in results:
        if raise_errors and isinstance(result, Exception):
            raise result
    return results


def _follow_redirections(client, calls, results: list[Any]) -> None:
    """Send the calls a cluster node redirected (they did not run) to the node the answer
    names: ``MOVED`` (its slots moved for good: a replica took over, or a move ended; the
    slot map is read again for later calls) or ``ASK`` (its slot is moving and the keys
    are there already: the call goes there after ``ASKING``). The answer is followed, not
    the map: the node asked for the map may not know of the move yet, and redis-py keeps
    no replicas in it (such a node gets a client of its own for these calls). A script
    that node lacks (Redis 7 does not copy scripts to replicas) is loaded there, and its
    calls sent there again."""
    redirected = [i for i, r in enumerate(results) if isinstance(r, AskError)]
    if not redirected:
        return
    if any(isinstance(results[i], MovedError) for i in redirected):
        follow_cluster(client)
    by_node: dict[tuple[str, int, bool], list[int]] = defaultdict(list)
    for i in redirected:
        answer = results[i]  # (MovedError is an AskError)
        by_node[answer.host, answer.port, not isinstance(answer, MovedError)].append(i)
    for (host, port, asking), indexes in by_node.items():
        node = client.get_node(host=host, port=port)
        node_client = (client.get_redis_connection(node) if node is not None else
                       client.nodes_manager.create_redis_node(
                           host, port, **client.nodes_manager.connection_kwargs))
        try:
            for attempt in range(2):
                replies = _pipeline(node_client, [calls[i] for i in indexes], asking)
                for index, reply in zip(indexes, replies, strict=True):
                    results[index] = reply
                indexes = [i for i in indexes if isinstance(results[i], NoScriptError)]
                if not indexes or attempt:
                    break
                for script in {calls[i][0] for i in indexes}:
                    node_client.script_load(script.source)
        finally:
            if node is None:
                node_client.close()


def _by_node(client, calls) -> list[tuple[Any, list[int]]]:
    """The calls (indexes) each Redis node runs, with a client of that node."""
    if not isinstance(client, RedisCluster):
        return [(client, list(range(len(calls))))]
    by_node: dict[str, list[int]] = defaultdict(list)
    clients = {}
    for index, (_, keys, _) in enumerate(calls):
        node = client.get_node_from_key(keys[0])
        by_node[node.name].append(index)
        clients[node.name] = node.redis_connection
    return [(clients[name], indexes) for name, indexes in by_node.items()]


def _send(client, calls) -> list[Any]:
    """Every call's reply or error, one pipeline per node (redis-py's cluster pipeline
    refuses EVALSHA)."""
    results: list[Any] = [None] * len(calls)
    for node, indexes in _by_node(client, calls):
        replies = _pipeline(node, [calls[i] for i in indexes])
        for index, reply in zip(indexes, replies, strict=True):
            results[index] = reply
    return results


def _pipeline(client, calls, asking: bool = False) -> list[Any]:
    """The calls' replies from one node; ``asking``: each after ``ASKING`` (a slot the node
    is importing), whose replies are left out."""
    pipe = client.pipeline(transaction=False)
    for script, keys, args in calls:
        if asking:
            pipe.execute_command("ASKING")
        script.queue(pipe, keys, args)
    replies = pipe.execute(raise_on_error=False)
    return replies[1::2] if asking else replies
