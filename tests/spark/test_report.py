"""The lateness report on a synthetic journal whose lateness is known, exported from Redis."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from celery_delayq.export import export_journal
from celery_delayq.spark.report import build_report

T0 = int(datetime(2030, 1, 1, 10, tzinfo=timezone.utc).timestamp() * 1000)
HOUR = 3_600_000


def _plant(client, journal: str, events: list[tuple[int, dict]]) -> None:
    """XADD events in time order with ids at their own times (the event time)."""
    last, seq = None, 0
    for ts, fields in sorted(events, key=lambda e: e[0]):
        seq = seq + 1 if ts == last else 0
        last = ts
        client.xadd(journal, fields, id=f"{ts}-{seq}")


def _job_events(task: str, job: str, due: int, promote_late: int, start_late: int,
                outcome: str) -> list[tuple[int, dict]]:
    base = {"job": job, "task": task, "key": ""}
    return [
        (due - 60_000, {"event": "scheduled", **base, "due": str(due)}),
        (due + promote_late, {"event": "promoted", **base, "due": str(due)}),
        (due + start_late, {"event": "started", **base, "task_id": job}),
        (due + start_late + 3, {"event": outcome, **base, "task_id": job}),
    ]


@pytest.fixture
def synthetic_events(delayq, redis_client, tmp_path):
    """refund: 100 jobs promoted 1..100 ms late, started 5 ms later, 1 in 10 failing,
    10 more scheduled and 4 of them cancelled; mail (next hour): lateness 10, 20, 30, 40."""
    refund, mail = [], []
    for n in range(1, 101):
        refund += _job_events("shop.refund", f"r{n}", T0 + 100_000 + n * 1000, n, n + 5,
                              "failed" if n % 10 == 0 else "succeeded")
    for n in range(10):
        fields = {"job": f"c{n}", "task": "shop.refund", "key": "", "due": str(T0 + HOUR)}
        refund.append((T0 + 200_000 + n, {"event": "scheduled", **fields}))
        if n < 4:
            refund.append((T0 + 300_000 + n, {"event": "cancelled", **fields, "by": "test"}))
    for n, late in enumerate((10, 20, 30, 40)):
        mail += _job_events("shop.mail", f"m{n}", T0 + HOUR + 100_000 + n * 1000, late,
                            late, "succeeded")
    _plant(delayq.store.client, delayq.store.keys.shard(0).journal, refund)
    _plant(delayq.store.client, delayq.store.keys.shard(3).journal, mail)
    out = tmp_path / "events"
    export_journal(delayq.store, out)
    return out


def test_report_gives_the_known_percentiles_counts_and_cancel_rate(spark, synthetic_events,
                                                                   tmp_path):
    report = build_report(spark, synthetic_events, tmp_path / "report", slowest=3)

    refund = next(r for r in report.by_task if r["task"] == "shop.refund")
    assert (refund["scheduled"], refund["promoted"], refund["cancelled"]) == (110, 100, 4)
    assert (refund["succeeded"], refund["failed"]) == (90, 10)
    assert refund["cancel_rate"] == pytest.approx(4 / 110)
    assert refund["promote_late_p50_ms"] == pytest.approx(50.5)
    assert refund["promote_late_p95_ms"] == pytest.approx(95.05)
    assert refund["promote_late_p99_ms"] == pytest.approx(99.01)
    assert refund["promote_late_max_ms"] == 100
    assert refund["start_late_p50_ms"] == pytest.approx(55.5)
    assert refund["start_late_max_ms"] == 105
    mail = next(r for r in report.hourly if r["task"] == "shop.mail")
    assert mail["hour"].hour == 11
    assert (mail["promote_late_p50_ms"], mail["promote_late_p95_ms"],
            mail["promote_late_p99_ms"]) == pytest.approx((25.0, 38.5, 39.7))
    assert [(s["job"], s["late_ms"]) for s in report.slowest] == [
        ("r100", 105), ("r99", 104), ("r98", 103)]


def test_report_writes_parquet_tables_and_a_self_contained_html_page(spark, synthetic_events,
                                                                     tmp_path):
    out = tmp_path / "report"
    report = build_report(spark, synthetic_events, out)

    hourly = spark.read.parquet(str(out / "hourly.parquet"))
    assert sorted((r.task, r.hour.hour) for r in hourly.collect()) == [
        ("shop.mail", 11), ("shop.refund", 10)]
    page = report.html.read_text()
    assert page.count("<svg") == 3 and "shop.refund" in page
    assert "<script" not in page and "src=" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")


def test_report_reads_json_lines_exports_too(spark, delayq, redis_client, tmp_path):
    _plant(delayq.store.client, delayq.store.keys.shard(1).journal,
           _job_events("shop.ping", "p1", T0, 7, 9, "succeeded"))
    export_journal(delayq.store, tmp_path / "events", fmt="jsonl")

    report = build_report(spark, tmp_path / "events", tmp_path / "report")

    (ping,) = report.by_task
    assert (ping["promote_late_max_ms"], ping["start_late_max_ms"]) == (7, 9)


def test_report_hours_are_utc_whatever_the_session_and_driver_time_zones(
        spark, synthetic_events, tmp_path, monkeypatch):
    """Half-hour offsets show it: Kolkata buckets on :30 UTC and labels local times."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    spark.conf.set("spark.sql.session.timeZone", "Asia/Kolkata")
    try:
        report = build_report(spark, synthetic_events, tmp_path / "report")
        assert spark.conf.get("spark.sql.session.timeZone") == "Asia/Kolkata"  # restored
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
        monkeypatch.delenv("TZ")
        time.tzset()

    assert sorted((r["task"], r["hour"]) for r in report.hourly) == [
        ("shop.mail", datetime(2030, 1, 1, 11, tzinfo=timezone.utc)),
        ("shop.refund", datetime(2030, 1, 1, 10, tzinfo=timezone.utc))]
    assert "01-01 10:00" in report.html.read_text()
