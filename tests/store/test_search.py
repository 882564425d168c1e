"""``pending(args_contains=...)``: finding pending jobs by a value they were called with."""

from __future__ import annotations

import pytest

from celery_delayq.errors import InvalidOption


@pytest.fixture
def calls(proj):
    """Pending calls with arguments of every JSON kind."""
    record = proj.anything
    record.apply_delayed(args=(42,), delay=600, job_id="order:42:close", key="order:42")
    record.apply_delayed(args=(142, "42"), delay=601, job_id="order:142:close")
    record.apply_delayed(args=(True,), delay=602, job_id="flag")
    record.apply_delayed(args=(1,), delay=603, job_id="one")
    record.apply_delayed(kwargs={"order": 42, "why": "late"}, delay=604, job_id="kw")
    record.apply_delayed(args=({"id": 7, "tags": ["a", "b"]},), delay=605, job_id="nested")
    proj.delayq.schedule(proj.slow.name, args=(42,), delay=606, job_id="slow-42")


def ids(jobs) -> list[str]:
    return [job.job_id for job in jobs]


def test_args_contains_matches_a_positional_or_keyword_value_in_due_order(delayq, calls):
    assert ids(delayq.pending(args_contains=42)) == ["order:42:close", "kw", "slow-42"]
    assert ids(delayq.pending(args_contains="42")) == ["order:142:close"]
    assert ids(delayq.pending(args_contains="late")) == ["kw"]


def test_args_contains_tells_true_from_one_and_matches_whole_values(delayq, calls):
    assert ids(delayq.pending(args_contains=True)) == ["flag"]
    assert ids(delayq.pending(args_contains=1)) == ["one"]
    assert ids(delayq.pending(args_contains=7)) == []  # inside a value, not a value
    assert ids(delayq.pending(args_contains={"tags": ["a", "b"], "id": 7})) == ["nested"]


def test_args_contains_combines_with_task_key_and_limit(proj, delayq, calls):
    assert ids(delayq.pending(task=proj.slow.name, args_contains=42)) == ["slow-42"]
    assert ids(delayq.pending(key="order:42", args_contains=42)) == ["order:42:close"]
    assert ids(delayq.pending(args_contains=42, limit=2)) == ["order:42:close", "kw"]


def test_args_contains_refuses_what_is_not_json(delayq, calls):
    with pytest.raises(InvalidOption, match="args_contains must be a JSON value"):
        delayq.pending(args_contains=object())
    with pytest.raises(InvalidOption, match="args_contains must be a JSON value"):
        delayq.pending(args_contains=float("nan"))
