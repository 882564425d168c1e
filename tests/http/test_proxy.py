"""Behind a proxy from the environment (``HTTPS_PROXY``), the proxy is asked only for the
host the allow-list checked, with a real Redis, worker and carrier and a local proxy."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from celery_delayq import http
from celery_delayq.http import TASK_NAME
from tests.conftest import wait_for

#: Passes ``*.example.com`` as written; urllib decodes the host and http.client writes it
#: raw into the CONNECT line, which then asks for 169.254.169.254:80.
INJECTED = "https://169.254.169.254%3a80%20HTTP%2f1.0%0d%0a%09x%5d%0d%0a%09.example.com/hook"


@pytest.fixture
def proxy_targets(monkeypatch) -> Iterator[list[str]]:
    """What a local stand-in for the ``HTTPS_PROXY`` proxy is asked to CONNECT to (it
    answers each ``502``)."""
    targets: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_CONNECT(self) -> None:
            targets.append(self.path)
            self.send_response(502)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, name="proxy", daemon=True)
    thread.start()
    for name in ("NO_PROXY", "no_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{httpd.server_address[1]}")
    http._opener.cache_clear()  # the opener reads the proxies when it is made
    yield targets
    monkeypatch.undo()
    http._opener.cache_clear()
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def test_a_percent_encoded_host_never_reaches_the_proxy(http_delayq, http_carrier,
                                                        proxy_targets):
    # Scheduled by name, so no call-site check: the worker's check is the last line.
    http_delayq.schedule(TASK_NAME, ["https://hooks.example.com/hook"], delay=0,
                         job_id="allowed")
    http_delayq.schedule(TASK_NAME, [INJECTED], delay=0, job_id="injected")

    dead = wait_for(lambda: len(http_delayq.store.dead()) == 2 and http_delayq.store.dead(),
                    timeout=60, what="both callbacks dead-lettered")  # 3 attempts each
    reasons = {entry["job_id"]: entry["reason"] for entry in dead}
    assert "refused by the worker" in reasons["injected"]
    assert "502" in reasons["allowed"]  # it went through the proxy
    assert proxy_targets == ["hooks.example.com:443"] * 3  # the attempt and its retries
