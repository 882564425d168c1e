"""Held due scores (held.py) turn back into their due times, in Python and in Lua."""

from __future__ import annotations

import re
from importlib import resources

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_delayq import held
from celery_delayq.reading import MAX_MS, MIN_MS


@pytest.mark.parametrize(("why", "base"), [("paused", held.PAUSED_BASE),
                                           ("rate limit", held.RATE_BASE)])
@given(due_ms=st.integers(MIN_MS, MAX_MS))
def test_a_held_score_gives_back_the_exact_due_time_of_any_date_and_why(why, base, due_ms):
    assert held.split_score(float(base + due_ms)) == (due_ms, why)


@given(st.one_of(st.floats(max_value=held.RANGES["paused"][0], exclude_max=True),
                 st.floats(min_value=held.RANGES["paused"][1], exclude_min=True,
                           max_value=held.RANGES["rate limit"][0], exclude_max=True),
                 st.floats(min_value=held.RANGES["rate limit"][1], exclude_min=True)))
def test_any_other_score_is_a_due_time_as_it_is(score):
    assert held.split_score(score) == (score, "")


def test_the_lua_scripts_hold_with_the_same_bases_and_range():
    lua = (resources.files("celery_delayq.scripts") / "include" / "held.lua").read_text()
    paused, rate = map(int, re.search(r"PAUSED_BASE, RATE_BASE = (\d+), (\d+)", lua).groups())
    low, high = map(int, re.search(r"MIN_DUE, MAX_DUE = (-?\d+), (\d+)", lua).groups())
    assert (paused, rate, low, high) == (held.PAUSED_BASE, held.RATE_BASE, MIN_MS, MAX_MS)
