"""The lateness report on a synthetic journal whose lateness is known, exported from Redis."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from celery_delayq.errors import InvalidOption
from celery_delayq.export import export_journal
from celery_delayq.spark.report import build_report

T0 = int(datetime(2030, 1, 1, 10, tzinfo=timezone.utc).timestamp() * 1000)
HOUR = 3_600_000


def plant(client, journal: str, events: list[tuple[int, dict]]) -> None:
    """XADD events in time order with ids at their own times (the event time)."""
    last, seq = None, 0
    pipe = client.pipeline(transaction=False)
    for ts, fields in sorted(events, key=lambda e: e[0]):
        seq = seq + 1 if ts == last else 0
        last = ts
        pipe.xadd(journal, fields, id=f"{ts}-{seq}")
    pipe.execute()


def job_events(task: str, job: str, due: int, promote_late: int, start_late: int,
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
    """refund: 100 jobs promoted 1..100 ms late, started 5 ms later, 1 in 10 failing and
    one ignored (``Ignore``),
    10 more scheduled and 4 of them cancelled; mail (next hour): lateness 10, 20, 30, 40."""
    refund, mail = [], []
    for n in range(1, 101):
        refund += job_events("shop.refund", f"r{n}", T0 + 100_000 + n * 1000, n, n + 5,
                             "failed" if n % 10 == 0 else "ignored" if n == 15
                             else "succeeded")
    for n in range(10):
        fields = {"job": f"c{n}", "task": "shop.refund", "key": "", "due": str(T0 + HOUR)}
        refund.append((T0 + 200_000 + n, {"event": "scheduled", **fields}))
        if n < 4:
            refund.append((T0 + 300_000 + n, {"event": "cancelled", **fields, "by": "test"}))
    for n, late in enumerate((10, 20, 30, 40)):
        mail += job_events("shop.mail", f"m{n}", T0 + HOUR + 100_000 + n * 1000, late,
                           late, "succeeded")
    plant(delayq.store.client, delayq.store.keys.shard(0).journal, refund)
    plant(delayq.store.client, delayq.store.keys.shard(3).journal, mail)
    out = tmp_path / "events"
    export_journal(delayq.store, out)
    return out


def test_report_gives_the_known_percentiles_counts_and_cancel_rate(spark, synthetic_events,
                                                                   tmp_path):
    report = build_report(spark, synthetic_events, tmp_path / "report", slowest=3,
                          bucket="hour")

    refund = next(r for r in report.by_task if r["task"] == "shop.refund")
    assert (refund["scheduled"], refund["promoted"], refund["cancelled"]) == (110, 100, 4)
    assert (refund["succeeded"], refund["failed"], refund["ignored"]) == (89, 10, 1)
    assert refund["cancel_rate"] == pytest.approx(4 / 110)
    assert refund["promote_late_p50_ms"] == pytest.approx(50.5)
    assert refund["promote_late_p95_ms"] == pytest.approx(95.05)
    assert refund["promote_late_p99_ms"] == pytest.approx(99.01)
    assert refund["promote_late_max_ms"] == 100
    assert refund["start_late_p50_ms"] == pytest.approx(55.5)
    assert refund["start_late_max_ms"] == 105
    mail = next(r for r in report.over_time if r["task"] == "shop.mail")
    assert mail["bucket"].hour == 11
    assert (mail["promote_late_p50_ms"], mail["promote_late_p95_ms"],
            mail["promote_late_p99_ms"]) == pytest.approx((25.0, 38.5, 39.7))
    assert [(s["job"], s["late_ms"]) for s in report.slowest] == [
        ("r100", 105), ("r99", 104), ("r98", 103)]


def test_a_window_under_three_hours_is_bucketed_by_minute(spark, synthetic_events, tmp_path):
    report = build_report(spark, synthetic_events, tmp_path / "report")

    assert report.bucket == "minute"
    mail = sorted((r["bucket"], r["promoted"]) for r in report.over_time
                  if r["task"] == "shop.mail" and r["promoted"])
    assert mail == [(datetime(2030, 1, 1, 11, 1, tzinfo=timezone.utc), 4)]
    refund = {r["bucket"].minute: r["promoted"] for r in report.over_time
              if r["task"] == "shop.refund" and r["promoted"]}
    assert refund == {1: 19, 2: 60, 3: 21}  # due 10:01:41..10:03:20, promoted 1..100 ms late
    assert "one minute" in Path(report.html).read_text()


def test_report_writes_parquet_tables_and_a_self_contained_page_to_a_hadoop_uri(
        spark, synthetic_events, tmp_path):
    out = f"file://{tmp_path}/report"

    report = build_report(spark, synthetic_events.as_uri(), out, bucket="hour")

    over_time = spark.read.parquet(f"{out}/over_time.parquet")
    assert sorted((r.task, r.bucket.hour) for r in over_time.collect()) == [
        ("shop.mail", 11), ("shop.refund", 10)]
    assert spark.read.parquet(f"{out}/by_task.parquet").count() == 2
    assert report.html == f"{out}/report.html"
    page = (tmp_path / "report" / "report.html").read_text()
    assert page.count('class="plotly-graph-div"') == 6 and "shop.refund" in page
    assert "<script src" not in page and "<link" not in page  # plotly.js is inline
    assert sorted(p.name for p in (tmp_path / "report").glob("[!.]*")) == [
        "by_task.parquet", "dead.parquet", "never_started.parquet", "over_time.parquet",
        "report.html", "slowest.parquet"]


def test_report_says_how_to_fix_missing_events(spark, tmp_path):
    with pytest.raises(FileNotFoundError, match="delayq export --to"):
        build_report(spark, (tmp_path / "nothing").as_uri(), tmp_path / "report")


def test_report_reads_json_lines_exports_too(spark, delayq, redis_client, tmp_path):
    plant(delayq.store.client, delayq.store.keys.shard(1).journal,
          job_events("shop.ping", "p1", T0, 7, 9, "succeeded"))
    export_journal(delayq.store, tmp_path / "events", fmt="jsonl")

    report = build_report(spark, tmp_path / "events", tmp_path / "report")

    (ping,) = report.by_task
    assert (ping["promote_late_max_ms"], ping["start_late_max_ms"]) == (7, 9)


def test_report_lists_dead_letters_jobs_never_started_and_the_backlog_at_export(
        spark, delayq, redis_client, tmp_path):
    mail = {"task": "shop.mail", "key": ""}
    events = [
        *job_events("shop.mail", "ok", T0, 5, 8, "succeeded"),
        (T0 - 90_000, {"event": "promoted", "job": "lost", **mail, "due": str(T0 - 90_000)}),
        (T0 - 1_000, {"event": "promoted", "job": "queued", **mail, "due": str(T0)}),  # < 1 min
        (T0 + 2_000, {"event": "dead", "job": "d1", **mail, "reason": "unknown queue 'x'"}),
        (T0 + 3_000, {"event": "dead", "job": "d2", **mail, "reason": "unknown queue 'x'"}),
        (T0 + 4_000, {"event": "replayed", "job": "d2", **mail, "due": str(T0 + 4_000)}),
        (T0 + 5_000, {"event": "scheduled", "job": "d3", "task": "shop.refund", "key": "",
                      "due": str(T0 + 6_000)}),
        (T0 + 9_000, {"event": "dead", "job": "d3", "reason": "out of retries"}),  # no task
    ]
    plant(delayq.store.client, delayq.store.keys.shard(0).journal, events)
    delayq.schedule_many("tests.proj.record", [
        {"job_id": f"p{n}", "delay": 600} for n in range(3)])
    export_journal(delayq.store, tmp_path / "events")

    report = build_report(spark, tmp_path / "events", tmp_path / "report")

    assert [(d["task"], d["reason"], d["dead"], d["replayed"]) for d in report.dead] == [
        ("shop.mail", "unknown queue 'x'", 2, 1), ("shop.refund", "out of retries", 1, 0)]
    assert [(j["job"], j["task"]) for j in report.never_started] == [("lost", "shop.mail")]
    assert report.backlog is not None
    assert report.backlog.total("pending") == 3
    assert report.backlog.tasks == {"tests.proj.record": 3}
    page = Path(report.html).read_text()
    assert "unknown queue &#x27;x&#x27;" in page and "out of retries" in page
    assert ">lost<" in page


def test_report_buckets_are_utc_whatever_the_session_and_driver_time_zones(
        spark, synthetic_events, tmp_path, monkeypatch):
    """Half-hour offsets show it: Kolkata buckets on :30 UTC and labels local times."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    spark.conf.set("spark.sql.session.timeZone", "Asia/Kolkata")
    try:
        report = build_report(spark, synthetic_events, tmp_path / "report", bucket="hour")
        assert spark.conf.get("spark.sql.session.timeZone") == "Asia/Kolkata"  # restored
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
        monkeypatch.delenv("TZ")
        time.tzset()

    assert sorted((r["task"], r["bucket"]) for r in report.over_time) == [
        ("shop.mail", datetime(2030, 1, 1, 11, tzinfo=timezone.utc)),
        ("shop.refund", datetime(2030, 1, 1, 10, tzinfo=timezone.utc))]
    assert "2030-01-01 10:00" in Path(report.html).read_text()


def test_a_truncated_json_line_is_dropped_and_counted_not_a_crash(spark, delayq,
                                                                  redis_client, tmp_path,
                                                                  caplog):
    plant(delayq.store.client, delayq.store.keys.shard(1).journal,
          job_events("shop.ping", "p1", T0, 7, 9, "succeeded"))
    export_journal(delayq.store, tmp_path / "events", fmt="jsonl")
    (exported,) = (tmp_path / "events").glob("date=*/*.jsonl")
    with exported.open("a") as file:
        file.write('\n{"id":"1-1","shard":0,"ts_ms":12\n')

    with caplog.at_level("WARNING", "celery_delayq.spark.report"):
        report = build_report(spark, tmp_path / "events", tmp_path / "report")

    assert report.events == 4
    assert "dropped 1 events without an id or time" in caplog.text


def test_a_folder_of_both_parquet_and_json_lines_exports_is_refused(spark, delayq,
                                                                    redis_client, tmp_path):
    plant(delayq.store.client, delayq.store.keys.shard(1).journal,
          job_events("shop.ping", "p1", T0, 7, 9, "succeeded"))
    export_journal(delayq.store, tmp_path / "events", fmt="jsonl")
    plant(delayq.store.client, delayq.store.keys.shard(2).journal,
          job_events("shop.ping", "p2", T0 + HOUR, 7, 9, "succeeded"))
    export_journal(delayq.store, tmp_path / "events")  # Parquet

    with pytest.raises(InvalidOption, match=r"both \.parquet and \.jsonl"):
        build_report(spark, tmp_path / "events", tmp_path / "report")


def test_a_run_a_worker_revoked_is_an_outcome_and_no_job_never_started(
        spark, delayq, redis_client, tmp_path):
    """A promoted job a worker discarded (revoked in the broker, expired: no ``started``)
    or stopped (terminated): ``revoked`` ends it, whatever its reason."""
    mail = {"task": "shop.mail", "key": ""}
    events = [*job_events("shop.mail", "ok", T0, 5, 8, "succeeded")]
    for n, reason in enumerate(("revoked", "expired")):
        due = T0 - 200_000 + n * 1000
        events += [
            (due, {"event": "promoted", "job": reason, **mail, "due": str(due)}),
            (due + 5, {"event": "revoked", "job": reason, **mail, "task_id": reason,
                       "due": str(due), "reason": reason})]
    due = T0 - 100_000
    events += [e for e in job_events("shop.mail", "terminated", due, 2, 4, "revoked")]
    events[-1][1].update(reason="terminated", due=str(due))
    events.append((T0 - 90_000, {"event": "promoted", "job": "lost", **mail,
                                 "due": str(T0 - 90_000)}))
    plant(delayq.store.client, delayq.store.keys.shard(0).journal, events)
    export_journal(delayq.store, tmp_path / "events")

    report = build_report(spark, tmp_path / "events", tmp_path / "report")

    (row,) = report.by_task
    assert (row["promoted"], row["started"], row["succeeded"], row["revoked"]) == (5, 2, 1, 3)
    assert [j["job"] for j in report.never_started] == ["lost"]
    assert "<th>revoked</th>" in Path(report.html).read_text()  # the page's tables too
