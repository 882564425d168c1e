"""Answers that break HTTP, and servers that never finish one: every attempt ends by its
deadline, and every failure is retried on the schedule, then dead-lettered with an excerpt.

The servers are raw sockets on 127.0.0.1 (``raw_server``), with a real Redis, worker and
carrier (``tests/http/conftest.py``).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from celery_delayq import http
from celery_delayq.http import EXCERPT_CHARS, TASK_NAME
from tests.conftest import journal_events, wait_for
from tests.http.conftest import RETRY_SCHEDULE, hung_up, read_request

ATTEMPTS = 1 + len(RETRY_SCHEDULE)
#: The drip servers send one byte this often: each read gets data well within any
#: per-read timeout, so only a deadline for the whole attempt can stop them.
DRIP_EVERY = 1.5
DEADLINE = 2.0


def callback(delayq):
    return delayq.app.tasks[TASK_NAME]


def dripping(head: bytes):
    """Read the request, send ``head``, then one more byte every DRIP_EVERY s, forever."""
    def reply(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(head)
        while not hung_up(conn, DRIP_EVERY):
            conn.sendall(b"a")
    return reply


def silent(conn: socket.socket) -> None:
    """Accept, never answer (not even a TLS handshake), until the client hangs up."""
    while not hung_up(conn, DRIP_EVERY):
        pass


def dead_after_every_attempt_cut_off(http_delayq, raw_server) -> dict:
    """The callback's dead letter, once every attempt was cut off within the deadline."""
    [dead] = wait_for(http_delayq.store.dead, timeout=30, what="a dead-lettered callback")
    assert len(raw_server.attempts) == ATTEMPTS
    # the server sees the last attempt's socket close just after the task gave it up
    wait_for(lambda: all(a.ended for a in raw_server.attempts), timeout=10,
             what="the server to see every attempt closed")
    for attempt in raw_server.attempts:
        assert attempt.ended - attempt.opened < DEADLINE + DRIP_EVERY + 1
    return dead


@pytest.mark.parametrize("scheme, reply", [
    ("http", dripping(b"HTTP/1.1 200 OK\r\nX-Drip: ")),
    ("http", dripping(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")),
    ("https", silent),
], ids=["headers-drip", "body-drip", "tls-handshake-never-answered"])
def test_a_server_that_never_finishes_its_answer_is_cut_off_at_the_attempt_deadline(
        http_delayq, http_carrier, raw_server, scheme, reply):
    raw_server.reply = reply
    callback(http_delayq).apply_delayed([raw_server.url(scheme=scheme)],
                                        {"timeout": DEADLINE}, delay=0)

    first = wait_for(lambda: raw_server.attempts, what="the first attempt")[0]
    wait_for(lambda: first.ended, timeout=10, what="the first attempt to be cut off")
    dead = dead_after_every_attempt_cut_off(http_delayq, raw_server)
    assert f"after {ATTEMPTS} attempts" in dead["reason"]
    assert f"within {DEADLINE:g} s" in dead["reason"]


def answer(raw: bytes, reset: bool = False):
    """Read the request, send ``raw`` and close (with a TCP reset if ``reset``)."""
    def reply(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(raw)
        if reset:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return reply


def tls_refused(conn: socket.socket) -> None:
    """What a plain HTTP server answers a TLS ClientHello with."""
    conn.recv(65536)
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


HEADERS_101 = b"".join(b"X-H%d: 1\r\n" % i for i in range(101))


@pytest.mark.parametrize("scheme, reply, excerpt", [
    ("http", answer(b"HTTP/1.1 abc OK\r\n\r\n"), "BadStatusLine"),
    ("http", answer(b"HTTP/1.1 200 OK\r\n" + HEADERS_101 + b"\r\nok"), "more than 100 headers"),
    ("http", answer(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10,
                    reset=True), "ConnectionResetError"),
    ("http", answer(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10),
     "IncompleteRead"),
    ("http", answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"),
     "IncompleteRead"),
    ("http", answer(b""), "RemoteDisconnected"),
    ("https", tls_refused, "SSLError"),
], ids=["malformed-status-line", "101-headers", "reset-mid-body", "truncated-body",
        "truncated-chunked-body", "closed-without-answer", "tls-to-plain-http"])
def test_a_broken_answer_is_retried_on_the_schedule_then_dead_lettered_with_an_excerpt(
        http_delayq, http_carrier, raw_server, scheme, reply, excerpt):
    raw_server.reply = reply
    result = callback(http_delayq).apply_delayed([raw_server.url(scheme=scheme)], delay=0,
                                                 job_id="partner:9:notify")

    [dead] = wait_for(http_delayq.store.dead, timeout=20, what="a dead-lettered callback")
    assert dead["job_id"] == "partner:9:notify"
    assert len(raw_server.attempts) == ATTEMPTS
    assert journal_events(http_delayq).count("retried") == len(RETRY_SCHEDULE)
    assert f"after {ATTEMPTS} attempts" in dead["reason"]
    assert excerpt in dead["reason"]
    assert len(dead["reason"]) < 3 * EXCERPT_CHARS
    wait_for(lambda: result.state == "FAILURE", what="the task to fail")


def test_a_broken_answer_dead_letter_replays_with_a_fresh_schedule(
        http_delayq, http_carrier, raw_server):
    raw_server.reply = answer(b"HTTP/1.1 abc OK\r\n\r\n")
    callback(http_delayq).apply_delayed([raw_server.url()], delay=0, job_id="partner:10")
    wait_for(http_delayq.store.dead, what="a dead-lettered callback")

    raw_server.reply = answer(b"HTTP/1.1 204 No Content\r\n\r\n")
    assert http_delayq.store.replay("partner:10")

    wait_for(lambda: len(raw_server.attempts) == ATTEMPTS + 1, what="the replayed attempt")
    wait_for(lambda: "succeeded" in journal_events(http_delayq), what="a success")
    assert http_delayq.store.dead() == []


def test_url_secrets_appear_in_no_reason_result_or_log(http_delayq, http_carrier,
                                                        callback_server, caplog):
    caplog.set_level(logging.INFO)
    callback_server.answer(500, b"boom")
    url = callback_server.url("/hook?order=42&token=s3cr3t-token&password=hunter2")
    result = callback(http_delayq).apply_delayed([url], delay=0)

    [dead] = wait_for(http_delayq.store.dead, what="a dead-lettered callback")
    wait_for(lambda: result.state == "FAILURE", what="the task to fail")
    assert callback_server.requests[0].path.endswith("token=s3cr3t-token&password=hunter2")
    shown = [dead["reason"], str(result.result), caplog.text]
    assert "/hook?order=***&token=***&password=***" in str(result.result)
    for text in shown:
        assert "s3cr3t" not in text and "hunter2" not in text


def over_tls(context: ssl.SSLContext, reply):
    """``reply`` on the TLS connection a client opens (handshake with ``context``)."""
    def tls_reply(conn: socket.socket) -> None:
        with context.wrap_socket(conn, server_side=True) as tls:
            reply(tls)
    return tls_reply


def test_a_callback_over_tls_verifies_the_certificate_and_succeeds(
        http_delayq, http_carrier, raw_server, tls_server_context):
    raw_server.reply = over_tls(tls_server_context,
                                answer(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nsafe"))
    result = callback(http_delayq).apply_delayed([raw_server.url(scheme="https")], delay=0)

    assert result.get(timeout=15) == {"status": 200, "excerpt": "safe"}


def test_a_tls_answer_dripping_its_body_is_cut_off_at_the_attempt_deadline(
        http_delayq, http_carrier, raw_server, tls_server_context):
    raw_server.reply = over_tls(tls_server_context, dripping(
        b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"))
    callback(http_delayq).apply_delayed([raw_server.url(scheme="https")],
                                        {"timeout": DEADLINE}, delay=0)

    dead = dead_after_every_attempt_cut_off(http_delayq, raw_server)
    assert f"HTTP 200, then timed out: no complete answer within {DEADLINE:g} s" in dead["reason"]


@pytest.fixture
def unanswered_port() -> Iterator[int]:
    """A port on every loopback address whose listener's accept backlog is full: a connect
    to it is never answered, like one to a host that drops every SYN."""
    listener = socket.create_server(("0.0.0.0", 0), backlog=0)
    port = listener.getsockname()[1]
    queued = []
    with contextlib.suppress(OSError):
        for _ in range(4):
            queued.append(socket.create_connection(("127.0.0.1", port), 0.2))
    yield port
    for sock in (*queued, listener):
        sock.close()


@pytest.fixture
def many_addresses(monkeypatch) -> str:
    """A host name that resolves to five loopback addresses (DNS stood in for)."""
    name, resolve = "many.example.com", socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host != name:
            return resolve(host, port, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "",
                 (f"127.0.0.{i}", port)) for i in range(2, 7)]
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return name


@pytest.fixture
def stalled_dns(monkeypatch) -> Iterator[str]:
    """A host name whose lookup stalls, as with a resolver that drops queries (each of
    glibc's tries waits 5 s); the stand-in answers "unknown" after 3 s, or at teardown."""
    name, resolve, released = "stalled.example.com", socket.getaddrinfo, threading.Event()

    def getaddrinfo(host, port, *args, **kwargs):
        if host != name:
            return resolve(host, port, *args, **kwargs)
        released.wait(3)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield name
    released.set()


def test_a_stalled_address_lookup_is_cut_off_at_the_attempt_deadline(stalled_dns):
    started = time.monotonic()
    response = http.post(f"http://{stalled_dns}/hook", {}, None, timeout=0.5)

    assert time.monotonic() - started < 1.0
    assert response.describe() == (f"no answer (timed out: no address for {stalled_dns} "
                                   f"within 0.5 s)")


def test_an_address_lookup_that_fails_in_time_says_why(stalled_dns):
    response = http.post(f"http://{stalled_dns}/hook", {}, None, timeout=5.0)

    assert response.describe() == ("no answer (gaierror: [Errno -3] Temporary failure in "
                                   "name resolution)")


def test_a_host_name_the_resolver_refuses_to_encode_says_why():
    response = http.post(f"http://{'a' * 64}.example.com/hook", {}, None, timeout=5.0)

    assert response.describe().startswith("no answer (UnicodeError: encoding with 'idna'")


def test_a_host_with_many_unanswering_addresses_is_cut_off_at_the_attempt_deadline(
        many_addresses, unanswered_port):
    started = time.monotonic()
    response = http.post(f"http://{many_addresses}:{unanswered_port}/hook", {}, None,
                         timeout=1.0)

    assert time.monotonic() - started < 1.5
    assert response.describe() == "no answer (timed out: no complete answer within 1 s)"


def test_a_host_whose_addresses_all_refuse_fails_with_the_last_refusal(many_addresses):
    with socket.create_server(("0.0.0.0", 0)) as listener:  # then closed: nobody listens
        port = listener.getsockname()[1]
    response = http.post(f"http://{many_addresses}:{port}/hook", {}, None, timeout=1.0)

    assert response.describe().startswith("no answer (ConnectionRefusedError: [Errno ")
    assert response.describe().endswith("] Connection refused)")
