"""The processes a benchmark runs against: redis-server, a Celery worker and a carrier.

``Cluster`` starts them on a free loopback port and stops all of them (whole process
groups, so prefork children too) on exit, Ctrl-C, SIGTERM or error. Benchmarks talk to
them through ``bench.app``, imported only once the server's URL is in the environment.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from celery_delayq.testing.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent
_STOP_GRACE = 15.0


@dataclass(frozen=True)
class WorkerSetup:
    """How the one Celery worker shared by every arm of a benchmark runs."""

    pool: str = "prefork"
    concurrency: int = 2

    def argv(self) -> list[str]:
        return ["worker", "-P", self.pool, "-c", str(self.concurrency), "-Q", "celery",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
                "-l", "WARNING"]


def celery_argv(*args: str, profile_to: Path | None = None) -> list[str]:
    """argv of ``celery -A bench.app ...``, optionally under pyinstrument."""
    if profile_to is None:
        return [sys.executable, "-m", "celery", "-A", "bench.app", *args]
    return [sys.executable, "-m", "pyinstrument", "-r", "text", "--show-all",
            "-o", str(profile_to), "-m", "celery", "-A", "bench.app", *args]


class Cluster:
    """``with Cluster(WorkerSetup()) as cluster: cluster.app ...``"""

    def __init__(self, worker: WorkerSetup, *, profile_carrier: Path | None = None,
                 carrier: bool = True) -> None:
        self.worker = worker
        self.profile_carrier = profile_carrier
        self.carrier = carrier
        self.redis = RedisServer()
        self._logs = tempfile.TemporaryDirectory(prefix="delayq-bench-")
        self._processes: dict[str, subprocess.Popen] = {}
        self._probes = 0
        self._old_sigterm = None
        self.app: ModuleType | None = None

    def __enter__(self) -> Cluster:
        self._old_sigterm = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            self.redis.start()
            os.environ["DELAYQ_BENCH_REDIS_URL"] = self.redis.url
            from bench import app

            if self.redis.url != app.REDIS_URL:
                raise RuntimeError("bench.app was imported before the bench's Redis started")
            self.app = app
            self.start_worker()
            if self.carrier:
                self.start_carrier()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start_worker(self) -> int:
        """Start the Celery worker; its pid (the parent of the pool's children)."""
        self._spawn("worker", celery_argv(*self.worker.argv()))
        return self._processes["worker"].pid

    def restart_worker(self) -> int:
        """Stop the worker, start a fresh one and wait until it ran a task; its pid."""
        self.stop("worker")
        pid = self.start_worker()
        self.wait_for_worker()
        return pid

    def wait_for_worker(self) -> None:
        """Wait until the worker ran a native probe task (it is up, or still alive)."""
        self._probes += 1
        runs_key = f"bench:probe:{self._probes}"
        self.app.native_probe.delay(runs_key)
        client = self.app.delayq.store.client
        wait_until(lambda: client.llen(runs_key) > 0, 60, "the worker to run a probe",
                   self.check_alive)
        client.delete(runs_key)

    def start_carrier(self, *options: str) -> None:
        """Start the carrier; ``options`` (e.g. ``--direct``) go to ``delayq carrier``."""
        self._spawn("carrier", celery_argv("delayq", "carrier", "-l", "WARNING", *options,
                                           profile_to=self.profile_carrier))

    def pid(self, name: str) -> int:
        """Process id of the running ``"worker"`` or ``"carrier"``."""
        return self._processes[name].pid

    def stop(self, name: str) -> None:
        """Stop the ``"worker"`` or ``"carrier"`` (whole process group: SIGTERM, SIGKILL)."""
        process = self._processes.pop(name, None)
        if process is not None:
            _stop_group(process)

    def _spawn(self, name: str, argv: list[str]) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        log = open(Path(self._logs.name) / f"{name}.log", "wb")  # noqa: SIM115
        self._processes[name] = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        log.close()

    def check_alive(self) -> None:
        """Raise with the log's tail when a worker or carrier died."""
        for name, process in self._processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}:\n"
                                   f"{self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = Path(self._logs.name) / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> None:
        """Stop the carrier and worker (SIGTERM, then SIGKILL), then Redis."""
        for name in ("carrier", "worker"):
            self.stop(name)
        self.redis.close()
        self._logs.cleanup()
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None


def _stop_group(process: subprocess.Popen) -> None:
    if process.poll() is None:
        _signal_group(process, signal.SIGTERM)
        try:
            process.wait(_STOP_GRACE)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait(_STOP_GRACE)
    _signal_group(process, signal.SIGKILL)  # leftover pool children of a dead parent


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def wait_until(predicate, timeout: float, what: str, on_poll=None,
               interval: float = 0.05) -> None:
    """Poll ``predicate`` until true; ``on_poll`` (e.g. a liveness check) runs each time."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if on_poll is not None:
            on_poll()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def machine_facts(client) -> dict:
    """CPU, versions and the load average: the context every result file records."""
    import platform
    from importlib import metadata

    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(), "cpu": cpu, "platform": platform.platform(),
        "python": platform.python_version(),
        "redis_server": client.info("server")["redis_version"],
        **{name: metadata.version(name) for name in ("celery", "kombu", "redis")},
        "loadavg_1m_3m_15m": list(os.getloadavg()),
    }
