"""The carrier's promotion log: a line per rare batch, at most one per 10 s under load."""

from __future__ import annotations

import logging

from celery_delayq.promotion_log import PromotionLog

LOGGER = logging.getLogger("test.promotion_log")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]


def test_a_batch_after_a_quiet_spell_is_logged_at_once(caplog):
    caplog.set_level(logging.INFO, LOGGER.name)
    clock = Clock()
    log = PromotionLog(LOGGER, clock=clock)
    log.batch([3.0, 1.0, 2.0])
    clock.now += 60
    log.batch([5.0])
    assert lines(caplog) == ["promoted 3 jobs; lateness p50 2.0 ms, max 3.0 ms",
                             "promoted 1 job; lateness p50 5.0 ms, max 5.0 ms"]


def test_busy_batches_are_summed_into_one_line_per_ten_seconds(caplog):
    caplog.set_level(logging.DEBUG, LOGGER.name)
    clock = Clock()
    log = PromotionLog(LOGGER, clock=clock)
    log.batch([1.0])
    for _ in range(1000):  # 100 batches a second for 10 s
        clock.now += 0.01
        log.batch([2.0, 4.0])
    assert lines(caplog) == [
        "promoted 1 job; lateness p50 1.0 ms, max 1.0 ms",
        "promoted 2,000 jobs in 10.0 s (1000 batches); lateness mean 3.0 ms, max 4.0 ms"]
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 1001


def test_what_is_left_is_logged_once_the_time_is_up_or_at_a_stop(caplog):
    caplog.set_level(logging.INFO, LOGGER.name)
    clock = Clock()
    log = PromotionLog(LOGGER, clock=clock)
    log.batch([1.0])
    clock.now += 1
    log.batch([7.0])
    clock.now += 1
    log.batch([9.0])
    log.flush_due()
    assert len(lines(caplog)) == 1
    clock.now += 8
    log.flush_due()
    assert lines(caplog)[1:] == ["promoted 2 jobs in 9.0 s (2 batches); lateness mean 8.0 ms, "
                                 "max 9.0 ms"]
    log.batch([2.0])
    log.flush()
    log.flush()
    assert lines(caplog)[2:] == ["promoted 1 job; lateness p50 2.0 ms, max 2.0 ms"]
