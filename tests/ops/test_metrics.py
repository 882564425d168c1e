"""Operating it: Prometheus metrics of a running carrier and the health probe."""

from __future__ import annotations

import re
import socket
import urllib.request

from celery_delayq.testing.redis_server import free_port
from tests.conftest import finish, wait_for


def scrape(port: int) -> dict[str, float]:
    """Every sample of the endpoint, keyed by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        match = re.match(r"^([a-z_]+(?:\{[^}]*\})?) (\S+)$", line)
        if match:
            samples[match[1]] = float(match[2])
    return samples


def total(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def test_scraped_metrics_move_as_jobs_are_scheduled_promoted_and_cancelled(proj, spawn,
                                                                           redis_client):
    port = free_port()
    spawn("delayq", "carrier", "--metrics-port", str(port))
    wait_for(lambda: _reachable(port), what="the metrics endpoint")
    before = scrape(port)
    assert total(before, "delayq_promoted_total") == 0

    later = proj.record.apply_delayed_many([{"args": (i,), "delay": 600} for i in range(7)])
    proj.record.apply_delayed_many([{"args": (i,), "delay": 0.1} for i in range(5)],
                                   queue="parked")
    later[0].cancel()
    wait_for(lambda: total(scrape(port), "delayq_promoted_total") == 5, what="5 promotions")
    after = scrape(port)
    assert total(after, "delayq_pending_jobs") == 6
    assert after[f'delayq_stored_jobs{{task="{proj.record.name}"}}'] == 6
    assert after["delayq_cancelled_total"] == 1
    assert total(after, "delayq_promotion_lateness_seconds_count") == 5
    assert after["delayq_claim_batch_size_sum"] >= 5
    assert total(after, "delayq_redis_roundtrip_seconds_count") > 0
    assert after["delayq_oldest_overdue_seconds"] == 0
    assert total(after, "delayq_paused_jobs") == total(after, "delayq_rate_limited_jobs") == 0


def test_jobs_held_by_a_pause_are_scraped_as_paused_not_overdue(proj, delayq, spawn,
                                                                redis_client):
    port = free_port()
    spawn("delayq", "carrier", "--metrics-port", str(port))
    wait_for(lambda: _reachable(port), what="the metrics endpoint")
    delayq.pause(queue="parked")
    proj.record.apply_delayed_many([{"args": (i,), "delay": 0.1} for i in range(3)],
                                   queue="parked")
    wait_for(lambda: total(scrape(port), "delayq_paused_jobs") == 3, what="3 paused jobs")
    after = scrape(port)
    assert total(after, "delayq_overdue_jobs") == 0
    assert after["delayq_oldest_overdue_seconds"] == 0


def test_health_fails_when_due_jobs_wait_unclaimed(proj, spawn, redis_client):
    code, output = _health(spawn)
    assert code == 0 and output.startswith("ok: 0 overdue jobs")
    proj.record.apply_delayed_many([{"args": (i,), "delay": 0} for i in range(3)])
    code, output = _health(spawn, "--max-overdue", "2")  # no carrier runs: they stay due
    assert code == 1 and output.startswith("unhealthy: 3 overdue jobs (max 2)")


def _health(spawn, *args: str) -> tuple[int, str]:
    process = spawn("delayq", "health", *args)
    output = finish(process)
    return process.returncode, output


def _reachable(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True


def test_a_metrics_port_in_use_stops_the_carrier_with_an_error_that_says_so(spawn):
    """(A carrier restarted while the old one still holds the port printed a traceback.)"""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = spawn("delayq", "carrier", "--metrics-host", "127.0.0.1",
                        "--metrics-port", str(port))
        output = finish(process)
    assert process.returncode == 1
    assert f"error: cannot serve metrics on 127.0.0.1:{port}" in output
    assert "Traceback" not in output

