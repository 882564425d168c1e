"""The HTTP callback suite's own Celery app, worker and carrier, and a real local HTTP server.

The app keeps its broker, results and delay store in Redis database 2 of the session's
server, with a queue of its own, so its settings (a short retry schedule, 127.0.0.1
allowed) never reach ``tests.proj``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from celery import Celery

from celery_delayq import DelayQ
from celery_delayq.carrier import Carrier

RETRY_SCHEDULE = (0.3, 0.6)


@pytest.fixture(scope="session")
def http_app(redis_server) -> Celery:
    url = f"{redis_server.url}/2"
    app = Celery("http-callbacks", broker=url, backend=url, set_as_current=False)
    app.conf.update(
        delayq_redis_url=url,
        delayq_prefix="delayq-http",
        delayq_shards=2,
        delayq_idle_timeout=0.5,
        delayq_http_allowed_hosts=["127.0.0.1"],
        delayq_http_retry_schedule=list(RETRY_SCHEDULE),
        delayq_http_timeout=2.0,
        task_default_queue="delayq-http",
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,  # pytest owns stdout; embedded workers share it
    )
    DelayQ(app)
    return app


@pytest.fixture
def http_delayq(http_app) -> Iterator[DelayQ]:
    """The app's DelayQ over an emptied store."""
    delayq = DelayQ.of(http_app)
    client = delayq.store.client
    stale = list(client.scan_iter(f"{delayq.store.keys.prefix}:*"))
    if stale:
        client.delete(*stale)
    yield delayq


@pytest.fixture(scope="session")
def http_worker(http_app):
    from celery.contrib.testing.worker import start_worker

    with start_worker(http_app, pool="threads", concurrency=2, perform_ping_check=False,
                      shutdown_timeout=10) as worker:
        yield worker


@pytest.fixture
def http_carrier(http_delayq, http_worker) -> Iterator[Carrier]:
    carrier = Carrier(http_delayq.app)
    thread = threading.Thread(target=carrier.run, name="http-carrier", daemon=True)
    thread.start()
    yield carrier
    carrier.stop()
    thread.join(10)


@dataclass
class Received:
    at: float  # time.monotonic()
    path: str
    headers: dict[str, str]
    body: object


@dataclass
class CallbackServer:
    """A real HTTP server on 127.0.0.1 answering POSTs from a script of (status, body)."""

    port: int = 0
    requests: list[Received] = field(default_factory=list)
    answers: list[tuple[int, bytes, dict[str, str]]] = field(default_factory=list)

    def answer(self, status: int, body: bytes = b"ok", **headers: str) -> None:
        """Queue one answer; the last one queued repeats for every later request."""
        self.answers.append((status, body, headers))

    def next_answer(self) -> tuple[int, bytes, dict[str, str]]:
        if not self.answers:
            return 200, b"ok", {}
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
def callback_server() -> Iterator[CallbackServer]:
    server = CallbackServer()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null")
            server.requests.append(Received(time.monotonic(), self.path,
                                            dict(self.headers.items()), body))
            status, payload, headers = server.next_answer()
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name.replace("_", "-"), value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, name="callback-server", daemon=True)
    thread.start()
    yield server
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)
