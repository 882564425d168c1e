"""Headless Chromium renders the report's charts offline and the page fits 800 px; the
screenshot in docs/img comes from this test (DELAYQ_UPDATE_SCREENSHOT=1)."""

from __future__ import annotations

import random
from datetime import datetime, timezone
from pathlib import Path

import pytest

from celery_delayq.export import export_journal
from celery_delayq.spark.report import build_report
from tests import browser
from tests.spark.test_report import HOUR, job_events, plant

TASKS = ("shop.close_unpaid_order", "shop.check_refund_status", "shop.send_reminder")
CHARTS = 6


@pytest.fixture
def chromium():
    with browser.chromium() as driver:
        yield driver


@pytest.fixture
def a_day_of_events(delayq, redis_client, tmp_path):
    """The last 30 hours, across midnight UTC: three tasks, lateness growing in an evening
    peak, some failures and retries, two dead letters, one job promoted and never started,
    40 jobs pending."""
    rng = random.Random(17)
    start = (delayq.store.now_ms() // HOUR - 30) * HOUR
    events: list[tuple[int, dict]] = []
    for hour in range(30):
        peak = 4 if (start // HOUR + hour) % 24 in (18, 19, 20) else 1
        for task in TASKS:
            for n in range(12):
                due = start + hour * HOUR + rng.randrange(HOUR)
                late = int(rng.expovariate(1 / (15 * peak)))
                outcome = rng.choices(("succeeded", "failed", "retried"), (90, 4, 6))[0]
                events += job_events(task, f"{task[5:9]}-{hour}-{n}", due, late,
                                     late + rng.randrange(2, 40 * peak), outcome)
    events += [(start + 5 * HOUR + n, {"event": "dead", "job": f"x{n}", "task": TASKS[0],
                                       "reason": "unknown queue 'orders-eu'"})
               for n in range(2)]
    events.append((start + 7 * HOUR, {"event": "promoted", "job": "stuck-1", "task": TASKS[1],
                                      "key": "", "due": str(start + 7 * HOUR - 900)}))
    plant(delayq.store.client, delayq.store.keys.shard(0).journal,
          [(ts, fields) for ts, fields in events if ts < start + 30 * HOUR])
    delayq.schedule_many("tests.proj.record", [
        {"job_id": f"p{n}", "delay": 600} for n in range(40)])
    export_journal(delayq.store, tmp_path / "events")
    return tmp_path / "events"


def test_report_renders_offline_in_chromium_and_fits_an_800_px_window(
        spark, a_day_of_events, tmp_path, chromium):
    from selenium.webdriver.common.by import By

    report = build_report(spark, a_day_of_events, tmp_path / "report")
    assert report.bucket == "hour"

    chromium.set_window_size(800, 900)
    chromium.get(Path(report.html).as_uri())
    plots = chromium.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")
    assert len(plots) == CHARTS
    assert all(p.find_elements(By.CSS_SELECTOR, ".main-svg") for p in plots)
    per_task = chromium.find_element(By.ID, "task-start-lateness")
    assert len(per_task.find_elements(By.CSS_SELECTOR, ".scatterlayer .trace")) == len(TASKS)
    assert [e for e in chromium.get_log("browser") if e["level"] == "SEVERE"] == []
    assert chromium.execute_script(
        "return performance.getEntriesByType('resource').length") == 0  # nothing fetched
    assert chromium.execute_script(
        "const page = document.documentElement; return page.scrollWidth <= page.clientWidth")
    assert chromium.execute_script(CLIPPED_LABELS) == []

    chromium.set_window_size(1280, 900)
    browser.screenshot(chromium, tmp_path, "spark-report.png", relayout=True)


#: Axis tick labels, axis titles and chart titles drawn outside their chart.
CLIPPED_LABELS = """
    const out = [];
    for (const svg of document.querySelectorAll('.js-plotly-plot .main-svg:first-child')) {
      const box = svg.getBoundingClientRect();
      const labels = '.xtick text, .ytick text, .xtitle, .ytitle, .gtitle';
      for (const t of svg.querySelectorAll(labels)) {
        const r = t.getBoundingClientRect();
        if (r.width && (r.left < box.left - 1 || r.right > box.right + 1
                        || r.top < box.top - 1 || r.bottom > box.bottom + 1))
          out.push(t.textContent);
      }
    }
    return out;"""


LURE = ('shop.refund<a href="https://phish.example/login"><b style="font-size:40px">'
        'Your session expired: sign in</b></a>')


@pytest.mark.parametrize("chart", ["bars", "lines"])
def test_a_task_name_is_drawn_as_text_never_as_a_link(tmp_path, chromium, chart):
    """Plotly reads labels and legend names as a little HTML: a task name could draw a
    working link in large letters on the page an operator opens."""
    from celery_delayq.spark import charts

    if chart == "bars":
        html = charts.grouped_bars("c", "Outcomes", "Events", "Task", [LURE, "shop.ok"],
                                   {LURE: [3, 4], "failed": [1, 1]})
    else:
        hours = [datetime(2026, 1, 1, h, tzinfo=timezone.utc) for h in range(3)]
        html = charts.over_time("c", "Lateness", "ms", "Time", {
            LURE: (hours, [1.0, 2.0, 3.0]), "shop.ok": (hours, [2.0, 1.0, 2.0])})
    page = tmp_path / "chart.html"
    page.write_text(f"<!doctype html><meta charset=utf-8>{charts.script()}{html}")
    chromium.get(page.as_uri())
    chromium.find_element("css selector", ".main-svg")
    assert chromium.execute_script("return document.querySelectorAll('svg a').length") == 0
    assert chromium.execute_script(
        "return Array.from(document.querySelectorAll('svg text')).some("
        "t => t.textContent.includes('<a href=\"https://phish.example/login\">'))")
