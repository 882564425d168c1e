"""The report reads each job's story by its cycle and the journal's entry order: a fast
worker's ``started`` before the carrier's ``promoted``, a replay in the dead letter's
millisecond, a dead letter dropped, a job moved to another shard by a replace."""

from __future__ import annotations

from celery_delayq.export import export_journal
from celery_delayq.spark.report import build_report
from tests.spark.test_report import T0, plant

MAIL = {"task": "shop.mail", "key": ""}


def report_of(spark, delayq, tmp_path, by_shard: dict[int, list[tuple[int, dict]]]):
    for shard, events in by_shard.items():
        plant(delayq.store.client, delayq.store.keys.shard(shard).journal, events)
    export_journal(delayq.store, tmp_path / "events")
    return build_report(spark, tmp_path / "events", tmp_path / "report")


def counts(report, task: str = "shop.mail") -> tuple:
    row = next(r for r in report.by_task if r["task"] == task)
    return (row["scheduled"], row["rescheduled"], row["cancelled"], row["dead"],
            row["cancel_rate"])


def test_a_start_journaled_before_its_promotion_is_no_job_never_started(
        spark, delayq, redis_client, tmp_path):
    def promoted(job, ts, due):
        return (ts, {"event": "promoted", "job": job, **MAIL, "due": str(due)})

    def started(job, ts, **due):
        return (ts, {"event": "started", "job": job, **MAIL, "task_id": job, **due})

    events = [
        started("fast", T0 + 5, due=str(T0)), promoted("fast", T0 + 8, T0),
        started("old", T0 + 6), promoted("old", T0 + 9, T0),  # a start without its due
        promoted("lost", T0, T0),
        # started in its first cycle, retried, promoted again and not started since
        promoted("retried", T0 - 9_000, T0 - 10_000),
        started("retried", T0 - 8_000, due=str(T0 - 10_000)),
        promoted("retried", T0 + 1, T0),
        (T0 + 120_000, {"event": "scheduled", "job": "later", **MAIL, "due": str(T0)}),
    ]

    report = report_of(spark, delayq, tmp_path, {0: events})

    assert [j["job"] for j in report.never_started] == ["lost", "retried"]


def test_a_dropped_dead_letter_is_no_cancel(spark, delayq, redis_client, tmp_path):
    def event(job, ts, name, **fields):
        return (ts, {"event": name, "job": job, **MAIL, **fields})

    events = [
        event("d", T0, "scheduled", due=str(T0)), event("d", T0 + 5, "dead", reason="x"),
        event("d", T0 + 9, "cancelled", by="ops", **{"from": "dead"}),
        event("c", T0, "scheduled", due=str(T0 + 60_000)), event("c", T0 + 7, "cancelled"),
    ]

    report = report_of(spark, delayq, tmp_path, {0: events})

    assert counts(report) == (2, 0, 1, 1, 0.5)


def test_a_replay_in_its_dead_letters_millisecond_counts_as_replayed(
        spark, delayq, redis_client, tmp_path):
    def event(job, name):
        return (T0, {"event": name, "job": job, **MAIL, "reason": "boom"})

    # d1 died, was replayed and died again, all in one millisecond: one of two replayed
    events = [event("d1", "dead"), event("d1", "replayed"), event("d1", "dead"),
              event("d2", "dead")]

    report = report_of(spark, delayq, tmp_path, {0: events})

    assert [(d["dead"], d["replayed"]) for d in report.dead] == [(3, 1)]


def test_a_replace_that_moves_a_job_counts_as_one_on_its_shard(
        spark, delayq, redis_client, tmp_path):
    def event(job, ts, name):
        return (ts, {"event": name, "job": job, **MAIL, "due": str(T0 + 60_000)})

    # the same calls: schedule, replace under a key of another shard (or of the same one),
    # cancel; "skewed" moves to a shard whose clock is ahead: its scheduled is 3 ms later
    old = [event("moved", T0, "scheduled"), event("moved", T0 + 2, "moved"),
           event("skewed", T0 + 5, "scheduled"), event("skewed", T0 + 9, "moved"),
           event("same", T0, "scheduled"), event("same", T0 + 1, "rescheduled"),
           event("same", T0 + 2, "cancelled"),
           event("fresh", T0 + 50, "scheduled")]  # on two shards, never moved: two
    new = [event("moved", T0 + 1, "scheduled"), event("moved", T0 + 3, "cancelled"),
           event("skewed", T0 + 12, "scheduled"), event("skewed", T0 + 13, "cancelled"),
           event("fresh", T0 + 51, "scheduled")]

    report = report_of(spark, delayq, tmp_path, {0: old, 3: new})

    assert counts(report) == (5, 3, 3, 0, 0.6)
