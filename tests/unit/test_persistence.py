"""The persistence verdict: a store's Redis without an append-only file loses jobs when it
stops, and the verdict says how many writes and how to turn AOF on."""

from __future__ import annotations

import logging

import pytest

from celery_delayq.persistence import Persistence, PersistenceWatch, persistence_problem


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


def test_a_redis_loading_its_data_is_not_reported_as_without_aof():
    """While Redis loads its append-only file after a restart, INFO says aof_enabled:0."""
    loading = Persistence.from_info({"loading": 1, "aof_enabled": 0,
                                     "rdb_changes_since_last_save": 5119})
    assert loading.aof is None and persistence_problem(loading) is None


def watched(readings: list[list[Persistence]], caplog) -> list[str]:
    """What a carrier's watch logs over successive maintenance passes."""
    passes = iter(readings)
    watch = PersistenceWatch(lambda: next(passes))
    with caplog.at_level(logging.INFO, logger="celery_delayq.carrier"):
        for _ in readings:
            watch.check()
    return [f"{record.levelname} {record.getMessage().split(':')[0]}"
            for record in caplog.records]


ON = Persistence.from_info({"aof_enabled": 1})
OFF = Persistence.from_info({"aof_enabled": 0, "rdb_changes_since_last_save": 3})
LOADING = Persistence.from_info({"loading": 1, "aof_enabled": 0})


def test_a_restart_that_loads_the_aof_leaves_the_watch_as_it_was(caplog):
    assert watched([[ON], [LOADING], [ON]], caplog) == []
    assert watched([[OFF], [LOADING], [OFF]], caplog) == [
        "WARNING NOT DURABLE"]


def test_the_watch_logs_once_per_change(caplog):
    assert watched([[OFF], [OFF], [ON], [ON], [OFF]], caplog) == [
        "WARNING NOT DURABLE",
        "INFO the store's Redis append-only file is on",
        "WARNING NOT DURABLE"]
