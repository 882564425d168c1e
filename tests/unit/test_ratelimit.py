"""Rate strings and the token buckets they make (ratelimit.py)."""

from __future__ import annotations

import pytest

from celery_delayq import ratelimit
from celery_delayq.errors import InvalidOption


@pytest.mark.parametrize(("spec", "parsed", "text"), [
    ("200/s", (200.0, 1000), "200/s"), ("30/m", (30.0, 60_000), "30/m"),
    (" 1000 / h ", (1000.0, 3_600_000), "1000/h"), ("5", (5.0, 1000), "5/s"),
    (12, (12.0, 1000), "12/s"), (0.5, (0.5, 1000), "0.5/s"),
])
def test_celery_rate_strings_are_read_as_jobs_per_window(spec, parsed, text):
    assert ratelimit.parse(spec) == parsed and ratelimit.text(spec) == text


@pytest.mark.parametrize("spec", ["", "0/s", "-1/s", "x", "10/d", "1e3/s", "/s", True, None,
                                  float("nan"), float("inf"), 0, [1]])
def test_anything_else_is_refused_with_examples(spec):
    with pytest.raises(InvalidOption, match=r"e\.g\. '200/s', '30/m', '1000/h'"):
        ratelimit.parse(spec)


@pytest.mark.parametrize(("spec", "shards"), [("1000/s", 4), ("1000/s", 8), ("21/m", 1),
                                              ("600/h", 2)])
def test_a_full_bucket_and_one_window_of_refill_never_pass_the_limit(spec, shards):
    jobs, window_ms = ratelimit.parse(spec)
    capacity, refill, text = ratelimit.bucket(spec, shards).split()
    per_window = shards * (float(capacity) + float(refill) * window_ms)
    assert per_window == pytest.approx(jobs) and text == ratelimit.text(spec)


@pytest.mark.parametrize(("value", "limits"), [
    ("1.0 0.000238 5/s", True), ("1 1e-9 1/h", True), ("off", False), ("nan nan 5/s", False),
    ("inf 1 5/s", False), ("0 0 5/s", False), ("garbage", False), ("1 1e9 x", False), ("", False),
])
def test_in_force_reads_a_limits_value_as_the_claim_script_does(value, limits):
    assert ratelimit.in_force(value) is limits
