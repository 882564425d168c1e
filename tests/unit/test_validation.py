"""Input checks that run before anything touches Redis."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest

from celery_delayq import validation
from celery_delayq.errors import InvalidDelay, InvalidJobId, InvalidOption

MAX = 3600.0


def test_relative_delay_is_counted_on_redis_clock():
    assert validation.due(1.5, None, MAX) == validation.Due(at_ms=None, delay_ms=1500)
    assert validation.due(timedelta(minutes=2), None, MAX).delay_ms == 120_000


def test_aware_eta_becomes_absolute_milliseconds():
    eta = datetime(2030, 1, 1, tzinfo=timezone.utc)
    assert validation.due(None, eta, 10 * 365 * 86400).at_ms == int(eta.timestamp() * 1000)


def test_eta_in_the_past_is_due_now_not_refused():
    eta = datetime.now(timezone.utc) - timedelta(hours=1)
    assert validation.due(None, eta, MAX).at_ms < datetime.now(timezone.utc).timestamp() * 1000


@pytest.mark.parametrize(("delay", "eta", "message"), [
    (None, None, "exactly one"),
    (5, datetime.now(timezone.utc), "exactly one"),
    (-1, None, ">= 0"),
    (float("nan"), None, "finite"),
    (float("inf"), None, "finite"),
    (10 ** 400, None, "finite"),  # an int past any float
    pytest.param(-(10 ** 5000), None, "finite", id="int past the digits Python prints"),
    (True, None, "seconds"),
    ("10", None, "seconds"),
    (MAX + 1, None, "delayq_max_delay"),
    (None, datetime(2030, 1, 1), "no timezone"),
    (None, "2030-01-01T00:00:00Z", "must be a datetime"),
    (None, datetime.now(timezone.utc) + timedelta(seconds=MAX * 2), "delayq_max_delay"),
])
def test_bad_delay_or_eta_is_refused_with_a_reason(delay, eta, message):
    with pytest.raises(InvalidDelay, match=message):
        validation.due(delay, eta, MAX)


@pytest.mark.parametrize(("value", "message"), [
    ("", "must not be empty"),
    ("x" * 201, "limit is delayq_max_id_length=200"),
    ("order\x0042", "control characters"),
    ("line\nbreak", "control characters"),
    (42, "must be a string"),
])
def test_bad_identifier_is_refused(value, message):
    with pytest.raises(InvalidJobId, match=message):
        validation.identifier(value, "job_id", 200)


def test_identifier_accepts_ordinary_business_ids():
    assert validation.identifier("order:42:close", "job_id", 200) == "order:42:close"


@pytest.mark.parametrize(("value", "named"), [
    ("order\x1b[2J", "U+001B"),
    ("order\x7f", "U+007F"),
    ("order:1\x85NEL", "U+0085"),  # C1 controls: NEL, and CSI, which colours a terminal
    ("order:\x9b31mred", "U+009B"),
    ("order:1\u2028FORGED LINE", "U+2028"),
    ("order:1\u2029", "U+2029"),
    ("order:\u202egnp.exe", "U+202E"),  # bidi controls reorder what a terminal shows
    ("order\u061c", "U+061C"),
    ("order\u200f", "U+200F"),
    ("\u2066order", "U+2066"),
])
def test_identifier_refuses_what_would_reach_a_terminal_raw_naming_the_character(value, named):
    with pytest.raises(InvalidJobId, match=re.escape(named)):
        validation.identifier(value, "key", 200)


@pytest.mark.parametrize("value", [
    "order:\xa042",  # no-break space: str.isprintable() refuses it
    "order:\u0378",  # unassigned today: valid on every Python, whatever its tables say
    "Bestellung:Müller-ß", "注文:42", "order:\U0001f600", "order:\u200b",
])
def test_identifier_accepts_the_same_text_on_every_python(value):
    assert validation.identifier(value, "key", 200) == value


def test_lookups_take_ids_writes_refuse_so_jobs_stored_before_are_found():
    validation.looked_up("order:\u202e1\x9b", "order:\u2028")


def test_unknown_if_exists_is_refused():
    with pytest.raises(InvalidOption, match="keep, replace, error"):
        validation.if_exists("overwrite")
