"""The persistence verdict: a store's Redis without an append-only file loses jobs when it
stops, and the verdict says how many writes and how to turn AOF on."""

from __future__ import annotations

import pytest

from celery_delayq.persistence import Persistence, persistence_problem


def test_a_redis_with_aof_on_has_no_problem():
    on = Persistence.from_info({"aof_enabled": 1, "rdb_changes_since_last_save": 900})
    assert on.aof is True and persistence_problem(on) is None


def test_aof_off_says_what_a_stop_loses_and_how_to_turn_it_on():
    off = Persistence.from_info({"aof_enabled": 0, "rdb_changes_since_last_save": 42})
    problem = persistence_problem(off)
    assert problem is not None
    assert "appendonly no" in problem and "42 writes since its last RDB snapshot" in problem
    assert "CONFIG SET appendonly yes" in problem and "redis.conf" in problem


@pytest.mark.parametrize("info", [{}, {"aof_enabled": "?"}])
def test_a_server_that_does_not_say_is_not_reported(info):
    """Redis-compatible servers that leave the field out (or damage it) are not guessed at."""
    assert persistence_problem(Persistence.from_info(info)) is None
