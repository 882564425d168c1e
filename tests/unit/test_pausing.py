"""Held due scores (pausing.py) turn back into their due times, in Python and in Lua."""

from __future__ import annotations

import re
from importlib import resources

from hypothesis import given
from hypothesis import strategies as st

from celery_delayq import pausing
from celery_delayq.reading import MAX_MS, MIN_MS


@given(st.integers(MIN_MS, MAX_MS))
def test_a_held_score_gives_back_the_exact_due_time_of_any_date(due_ms):
    assert pausing.split_score(float(pausing.HELD_BASE + due_ms)) == (due_ms, True)


@given(st.one_of(st.floats(max_value=pausing.HELD_MIN, exclude_max=True),
                 st.floats(min_value=pausing.HELD_MAX, exclude_min=True)))
def test_any_other_score_is_a_due_time_as_it_is(score):
    assert pausing.split_score(score) == (score, False)


def test_the_lua_scripts_hold_with_the_same_base_and_range():
    lua = (resources.files("celery_delayq.scripts") / "include" / "held.lua").read_text()
    base = int(re.search(r"HELD_BASE = (\d+)", lua)[1])
    low, high = re.search(r"HELD_MIN, HELD_MAX = HELD_BASE - (\d+), HELD_BASE \+ (\d+)",
                          lua).groups()
    assert (base, base - int(low), base + int(high)) == (
        pausing.HELD_BASE, pausing.HELD_MIN, pausing.HELD_MAX)
