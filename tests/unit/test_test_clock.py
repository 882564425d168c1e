"""How far ``DelayQTester.advance`` moves the test clock: a time, or a clear error."""

from __future__ import annotations

from datetime import timedelta

import pytest

from celery_delayq.testing.tester import _duration


@pytest.mark.parametrize(("delta", "parts", "step"), [
    (None, {}, timedelta()),
    (90, {}, timedelta(seconds=90)),
    (timedelta(minutes=1), {"seconds": 30}, timedelta(seconds=90)),
    (None, {"days": 1, "hours": 2}, timedelta(days=1, hours=2)),
])
def test_the_step_adds_the_delta_and_the_parts(delta, parts, step):
    assert _duration(delta, **parts) == step


@pytest.mark.parametrize(("delta", "parts", "error", "says"), [
    (-1, {}, ValueError, "only moves forward"),
    (float("nan"), {}, ValueError, "a finite time"),
    (float("inf"), {}, ValueError, "a finite time"),
    (None, {"days": 1e12}, ValueError, "a finite time"),
    ("60", {}, TypeError, "a timedelta or seconds"),
    (True, {}, TypeError, "a timedelta or seconds"),
], ids=["negative", "nan", "inf", "past-timedelta", "text", "bool"])
def test_a_step_that_is_no_forward_time_is_refused_clearly(delta, parts, error, says):
    """Infinity and a step past what a timedelta holds raised a bare OverflowError."""
    with pytest.raises(error, match=says):
        _duration(delta, **parts)
