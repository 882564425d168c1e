"""Compatibility tests: celery-delayq in other people's projects and Celery's own tools."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

from tests.conftest import ROOT


@contextlib.contextmanager
def worker_and_carrier(module: str, queue: str, env: dict[str, str]) -> Iterator[None]:
    """A Celery worker of ``queue`` and a carrier, processes of ``celery -A module``."""
    celery = [sys.executable, "-m", "celery", "-A", module]
    services = [subprocess.Popen([*celery, *args], cwd=ROOT, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for args in (("worker", "-Q", queue, "-P", "solo", "--without-heartbeat",
                              "--without-gossip", "--without-mingle"),
                             ("delayq", "carrier"))]
    try:
        yield
    finally:
        for service in services:
            service.terminate()
            service.wait(20)
