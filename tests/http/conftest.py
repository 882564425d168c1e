"""The HTTP callback suite's own Celery app, worker and carrier, and a real local HTTP server.

The app keeps its broker, results and delay store in Redis database 2 of the session's
server, with a queue of its own, so its settings (a short retry schedule, 127.0.0.1 and
``*.example.com`` allowed) never reach ``tests.proj``. Its worker runs in a pytest process of
its own (``pytest tests/http``): beside ``tests.proj``'s, both would run tasks from one
app's registry (``tests/conftest.py``, ``running_worker``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import select
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from celery import Celery

from celery_delayq import DelayQ, http
from celery_delayq.carrier import Carrier
from tests.conftest import running_worker

RETRY_SCHEDULE = (0.3, 0.6)


@pytest.fixture(scope="session")
def http_app(redis_server) -> Iterator[Celery]:
    url = f"{redis_server.url}/2"
    app = Celery("http-callbacks", broker=url, backend=url, set_as_current=False)
    app.conf.update(
        delayq_redis_url=url,
        delayq_prefix="delayq-http",
        delayq_shards=2,
        delayq_idle_timeout=0.5,
        delayq_http_allowed_hosts=["127.0.0.1", "*.example.com"],
        delayq_http_retry_schedule=list(RETRY_SCHEDULE),
        delayq_http_timeout=2.0,
        task_default_queue="delayq-http",
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,  # pytest owns stdout; embedded workers share it
    )
    DelayQ(app)
    yield app
    # Results waiting in reference cycles unsubscribe from their channel when collected; on
    # Celery 5.3 that retries the connection ~20 s each once the server is gone (at exit).
    gc.collect()


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
    with running_worker(http_app, concurrency=2, shutdown_timeout=10) as worker:
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


@dataclass
class Attempt:
    """One connection a :class:`RawServer` accepted (times are ``time.monotonic()``)."""

    opened: float
    ended: float | None = None  # when the reply ended or the client was seen to hang up


@dataclass
class RawServer:
    """A TCP server on 127.0.0.1 that answers each connection with ``reply(conn)``: for
    answers no HTTP server library would send (slow drips, broken protocol, resets)."""

    reply: Callable[[socket.socket], None] = lambda conn: None
    port: int = 0
    attempts: list[Attempt] = field(default_factory=list)
    conns: list[socket.socket] = field(default_factory=list)

    def url(self, path: str = "/hook", scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def serve(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # the listener was closed: the test is over
                return
            attempt = Attempt(time.monotonic())
            self.attempts.append(attempt)
            self.conns.append(conn)
            threading.Thread(target=self._answer, args=(conn, attempt), daemon=True).start()

    def _answer(self, conn: socket.socket, attempt: Attempt) -> None:
        with conn:
            try:
                self.reply(conn)
            except OSError:
                pass
            finally:
                attempt.ended = time.monotonic()


def read_request(conn: socket.socket) -> bytes:
    """Read one HTTP request (head and Content-Length body) from ``conn``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def hung_up(conn: socket.socket, wait: float) -> bool:
    """True as soon as the client closes ``conn`` (within ``wait`` seconds), else False."""
    readable, _, _ = select.select([conn], [], [], wait)
    if not readable:
        return False
    try:
        return conn.recv(1) == b""
    except ConnectionError:
        return True


@pytest.fixture
def raw_server() -> Iterator[RawServer]:
    server = RawServer()
    listener = socket.create_server(("127.0.0.1", 0))
    server.port = listener.getsockname()[1]
    thread = threading.Thread(target=server.serve, args=(listener,), name="raw-server",
                              daemon=True)
    thread.start()
    yield server
    for sock in (listener, *server.conns):  # wakes accept() and every reply still running
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    listener.close()
    thread.join(5)


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory) -> tuple[str, str]:
    """A self-signed certificate (and its key) for 127.0.0.1, made by the openssl CLI."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = str(folder / "cert.pem"), str(folder / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    return cert, key


@pytest.fixture
def tls_server_context(tls_files, monkeypatch) -> Iterator[ssl.SSLContext]:
    """A server-side TLS context whose certificate the callback trusts (``SSL_CERT_FILE``,
    read when the callback's TLS context is made: made afresh here, and again after)."""
    cert, key = tls_files
    monkeypatch.setenv("SSL_CERT_FILE", cert)
    http._opener.cache_clear()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    yield context
    monkeypatch.undo()
    http._opener.cache_clear()
