"""The benchmarks' quick modes run end to end (opt-in: ``pytest -m bench``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.harness import ROOT

pytestmark = pytest.mark.bench


def run_quick(module: str, tmp_path) -> tuple[str, dict]:
    """``python -m bench.<module> --quick``: its output, and the JSON it wrote."""
    out = tmp_path / f"{module}.json"
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", "--quick", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())


@pytest.mark.timeout(300)
def test_quick_lateness_bench_runs_and_writes_json(tmp_path):
    stdout, result = run_quick("lateness", tmp_path)
    assert "schedule, one call at a time" in stdout

    rep = result["repetitions"][0]
    tasks = result["parameters"]["tasks"]
    for arm in ("delayq", "native", "delayq_lead", "native_paced"):
        assert rep[arm]["worker_lateness_ms"]["n"] == tasks
        assert rep[arm]["duplicates"] == 0
        assert rep[arm]["schedule_per_s"] > 0
        assert set(rep[arm]["worker_gc"]) == {"count", "max_ms", "total_ms"}
        assert rep[arm]["worker_rss_growth_mib"] is None, "one worker serves every arm"
    assert rep["delayq"]["promotion_lateness_ms"]["n"] == tasks
    assert rep["delayq"]["promotion_lateness_ms"]["min"] >= 0, "promoted before due"
    assert rep["delayq"]["worker_lateness_ms"]["min"] >= 0, "ran before due"
    assert rep["delayq_lead"]["worker_lateness_ms"]["min"] >= 0, "a lead job ran before due"
    assert rep["worker_drain"]["worker_start_per_s"] > 0
    if result["parameters"]["bullmq_skipped"] is None:  # Node and npm are there
        assert rep["bullmq"]["worker_lateness_ms"]["n"] == tasks
        assert rep["bullmq"]["worker_lateness_ms"]["min"] >= 0, "BullMQ ran a job before due"
    for arm in ("promotion", "promotion_direct"):
        assert rep[arm]["promoted"] == result["parameters"]["promotion_tasks"], arm
        assert rep[arm]["lateness_ms"]["min"] >= 0, f"{arm}: promoted before due"
    assert rep["celery_alone"]["published"] == result["parameters"]["promotion_tasks"]
    assert set(result["summary"]) >= {"delayq.schedule_per_s", "native.schedule_per_s",
                                      "promotion.promotion_per_s",
                                      "promotion_direct.promotion_per_s",
                                      "celery_alone.per_s",
                                      "ratios.promotion_vs_celery_alone"}


@pytest.mark.timeout(300)
def test_quick_scheduling_bench_runs_and_writes_json(tmp_path):
    stdout, result = run_quick("scheduling", tmp_path)
    assert "apply_delayed ÷ client ceiling" in stdout

    rep = result["repetitions"][0]
    for arm in ("client ceiling", "delayq", "native", "delayq batched"):
        assert rep[arm]["per_s"] > 0 and rep[arm]["bytes_per_job"] > 0, arm


@pytest.mark.timeout(300)
def test_quick_worker_events_bench_runs_and_writes_json(tmp_path):
    _, result = run_quick("worker_events", tmp_path)

    rep = result["repetitions"][0]
    tasks = result["parameters"]["tasks"]
    assert rep["events on"]["started_events"] == rep["events on"]["succeeded_events"] == tasks
    assert rep["events off"]["started_events"] == 0
    assert rep["events on"]["duplicates"] == rep["events off"]["duplicates"] == 0
