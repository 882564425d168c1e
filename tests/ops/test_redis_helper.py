"""The quickstart's Redis helper (``python -m celery_delayq.testing.redis_server``)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest

from celery_delayq.testing.redis_server import free_port
from tests.conftest import wait_for


def _serving(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT],
                         ids=["SIGTERM", "SIGHUP", "SIGINT"])
def test_the_redis_helper_stops_its_server_when_it_is_signalled(signum):
    port = free_port()
    helper = subprocess.Popen([sys.executable, "-m", "celery_delayq.testing.redis_server",
                               "--port", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert "serving redis://127.0.0.1" in helper.stdout.readline()
        assert _serving(port)
        helper.send_signal(signum)
        helper.wait(10)
        wait_for(lambda: not _serving(port), timeout=5, what="redis-server to stop")
    finally:
        helper.kill()
        helper.wait(10)
