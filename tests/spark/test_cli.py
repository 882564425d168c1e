"""``python -m celery_delayq.spark schedule|report`` (run in-process on the shared session)."""

from __future__ import annotations

import csv

import pytest

from celery_delayq.export import export_journal
from celery_delayq.spark.__main__ import main


def test_schedule_command_reads_csv_prints_progress_and_keeps_rejects(spark, redis_server,
                                                                       delayq, tmp_path,
                                                                       capsys):
    source = tmp_path / "refunds.csv"
    with open(source, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["refund_id", "delay_s", "amount"])
        writer.writerows([[f"r{n}", 600, n] for n in range(300)])
        writer.writerow(["", 600, 1])

    code = main(["schedule", "--broker", f"{redis_server.url}/0", "--set", "delayq_shards=4",
                 "--input", str(source), "--format", "csv", "--task", "shop.refund",
                 "--id-col", "refund_id", "--delay-col", "delay_s",
                 "--args-cols", "refund_id,amount", "--partitions", "3",
                 "--rejects", str(tmp_path / "rejects")])

    out, err = capsys.readouterr()
    assert code == 0, err
    assert "scheduled 300, already existed 0, rejected 1" in out
    assert "partitions 3/3 done, 300 rows written" in err
    (reject,) = spark.read.parquet(str(tmp_path / "rejects")).collect()
    assert reject.refund_id is None and reject.reason.startswith("null id")
    assert delayq.get("r7").args == ["r7", 7]


def test_csv_id_key_and_queue_columns_are_read_as_text_not_numbers(spark, redis_server,
                                                                    delayq, tmp_path, capsys):
    source = tmp_path / "refunds.csv"
    source.write_text("refund_id,delay_s,shop,q,amount\n007,600,0042,1,10\n")

    code = main(["schedule", "--broker", f"{redis_server.url}/0", "--set", "delayq_shards=4",
                 "--input", str(source), "--format", "csv", "--task", "shop.refund",
                 "--id-col", "refund_id", "--delay-col", "delay_s", "--key-col", "shop",
                 "--queue-col", "q", "--args-cols", "amount"])

    assert code == 0, capsys.readouterr().err
    job = delayq.get("007")
    assert job is not None and job.key == "0042" and job.args == [10]


def test_rejects_holding_a_date_python_cannot_read_are_printed_after_the_write(
        spark, redis_server, delayq, tmp_path, capsys):
    source = str(tmp_path / "refunds")
    spark.sql("select 'r1' as refund_id, 60.0 as delay_s, make_date(10000, 1, 1) as d "
              "union all select 'r2', 60.0, date'2030-01-01'").write.parquet(source)

    code = main(["schedule", "--broker", f"{redis_server.url}/0", "--set", "delayq_shards=4",
                 "--input", source, "--task", "shop.refund", "--id-col", "refund_id",
                 "--delay-col", "delay_s", "--args-cols", "d"])

    out, err = capsys.readouterr()
    assert code == 0, err
    assert "scheduled 1, already existed 0, rejected 1" in out
    assert "  rejected 'r1': " in out


def test_report_command_writes_the_page_and_prints_lateness(spark, delayq, redis_client,
                                                           tmp_path, capsys):
    journal = delayq.store.keys.shard(0).journal
    delayq.store.client.xadd(journal, {"event": "promoted", "job": "a", "task": "shop.a",
                                "due": "1893456000000"}, id="1893456000012-0")
    export_journal(delayq.store, tmp_path / "events")

    code = main(["report", "--events", str(tmp_path / "events"), "--out",
                 str(tmp_path / "report")])

    out, _ = capsys.readouterr()
    assert code == 0
    assert "shop.a: promoted 1, p50/p95/p99 promote lateness 12.0/12.0/12.0 ms" in out
    assert (tmp_path / "report" / "report.html").exists()


def test_commands_say_how_to_fix_a_missing_app(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    code = main(["schedule", "--input", str(tmp_path), "--task", "t", "--id-col", "i",
                 "--delay-col", "d"])
    assert code == 1
    assert "-A module:app" in capsys.readouterr().err


@pytest.mark.parametrize("mistake", [["--partitions", "0"], ["--partitions", "-1"],
                                     ["--batch-size", "0"], ["--conf", "spark.ui.enabled"],
                                     ["--conf", "=true"]])
def test_an_argument_out_of_its_range_is_a_usage_error_before_spark_starts(
        capsys, tmp_path, mistake):
    with pytest.raises(SystemExit) as stopped:
        main(["schedule", "--broker", "redis://127.0.0.1:1/0", "--input", str(tmp_path),
              "--task", "t", "--id-col", "i", "--delay-col", "d", *mistake])
    assert stopped.value.code == 2
    assert f"argument {mistake[0]}" in capsys.readouterr().err


@pytest.mark.parametrize("source", ["missing", "csv read as parquet"])
def test_an_input_spark_cannot_read_is_one_error_line_not_a_traceback(
        spark, redis_server, capsys, tmp_path, source):
    path = tmp_path / "refunds.csv"
    if source != "missing":
        path.write_text("refund_id,delay_s\nr1,600\n")
    code = main(["schedule", "--broker", f"{redis_server.url}/0", "--input", str(path),
                 "--format", "parquet", "--task", "shop.refund", "--id-col", "refund_id",
                 "--delay-col", "delay_s"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(f"error: cannot read --input {path}: ")
    assert "Traceback" not in err and "\tat " not in err
