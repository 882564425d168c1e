"""The changelist's chart of pending work: the SVG builder, the hourly counts, the admin page."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from celery_delayq.contrib.django.chart import (
    EMPTY_MESSAGE,
    OTHER,
    hour_buckets,
    pending_per_hour,
    render_svg,
    top_series,
)
from celery_delayq.contrib.django.models import DelayedTask

SVG = "{http://www.w3.org/2000/svg}"
CHANGELIST = "admin:delayq_delayedtask_changelist"
CLOSE, REFUND = "shop.tasks.close_unpaid_order", "shop.tasks.check_refund_status"
NOW = datetime(2025, 3, 11, 13, 20, tzinfo=ZoneInfo("UTC"))


def _bars(svg: str) -> list[ET.Element]:
    return ET.fromstring(svg).findall(f"{SVG}rect[@class='bar']")


def _hours(n: int = 3) -> list[datetime]:
    return [NOW.replace(minute=0) + timedelta(hours=i) for i in range(n)]


def test_bar_heights_are_proportional_to_the_counts():
    bars = _bars(render_svg(_hours(), {CLOSE: [2, 8, 4]}))
    heights = {b.get("data-hour"): float(b.get("height")) for b in bars}
    assert heights["14:00"] == pytest.approx(4 * heights["13:00"], rel=0.01)
    assert heights["15:00"] == pytest.approx(2 * heights["13:00"], rel=0.01)


def test_each_task_is_its_own_stacked_series_with_a_legend_entry_and_colour():
    svg = render_svg(_hours(), {CLOSE: [3, 0, 1], REFUND: [1, 2, 0]})
    bars = _bars(svg)
    assert {(b.get("data-task"), b.get("data-hour"), b.get("data-count")) for b in bars} == {
        (CLOSE, "13:00", "3"), (CLOSE, "15:00", "1"), (REFUND, "13:00", "1"),
        (REFUND, "14:00", "2")}
    first_hour = sorted((b for b in bars if b.get("data-hour") == "13:00"),
                        key=lambda b: float(b.get("y")))
    top, bottom = first_hour
    assert float(top.get("y")) + float(top.get("height")) == pytest.approx(
        float(bottom.get("y")), abs=0.11), "the hour's segments sit on each other"
    assert top.get("fill") != bottom.get("fill")
    legend = [t.text for t in ET.fromstring(svg).iter(f"{SVG}text")
              if t.text in (CLOSE, REFUND)]
    assert legend == [CLOSE, REFUND]


def test_every_segment_and_the_whole_chart_say_their_numbers_in_text():
    root = ET.fromstring(render_svg(_hours(), {CLOSE: [3, 0, 1]}, tz_name="UTC"))
    assert root.get("role") == "img" and "delayq-chart-title" in root.get("aria-labelledby")
    assert root.find(f"{SVG}title").text == "Pending delayed tasks per hour, next 24 hours"
    assert root.find(f"{SVG}desc").text == (
        f"4 pending tasks in the next 24 hours: 4 {CLOSE}. "
        "Busiest hour: Tue 13:00 with 3 (times in UTC).")
    assert [b.find(f"{SVG}title").text for b in _bars(ET.tostring(root).decode())] == [
        f"Tue 13:00 to 14:00: 3 {CLOSE}", f"Tue 15:00 to 16:00: 1 {CLOSE}"]


def test_no_pending_work_draws_no_bars_and_says_so():
    svg = render_svg(_hours(), {})
    assert _bars(svg) == [] and EMPTY_MESSAGE in svg
    assert ET.fromstring(svg).find(f"{SVG}desc").text == EMPTY_MESSAGE


def test_task_names_are_escaped_in_the_svg():
    svg = render_svg(_hours(1), {"<script>x</script>": [1]})
    assert "<script>" not in svg and ET.fromstring(svg) is not None


def test_tasks_beyond_the_biggest_few_are_summed_as_other_tasks():
    series = {"a": [5, 0], "b": [1, 1], "c": [0, 1], "d": [3, 3]}
    assert top_series(series, 2) == {"d": [3, 3], "a": [5, 0], OTHER: [1, 2]}


def test_hours_are_clock_hours_of_the_given_time_zone_covering_the_window():
    kolkata = ZoneInfo("Asia/Kolkata")  # UTC+05:30: local hours start at :30 UTC
    hours = hour_buckets(NOW, NOW + timedelta(hours=24), kolkata)
    assert len(hours) == 25, "a window not starting on the hour touches 25 clock hours"
    assert hours[0] == datetime(2025, 3, 11, 18, 0, tzinfo=kolkata)
    assert {h.minute for h in hours} == {0}


@pytest.mark.django_db
def test_counts_pending_rows_per_local_hour_and_task_in_one_query():
    paris = ZoneInfo("Europe/Paris")  # 13:20 UTC is 14:20 in Paris
    _row("a", CLOSE, NOW + timedelta(minutes=5))  # 14:25 Paris
    _row("b", CLOSE, NOW + timedelta(minutes=30))  # 14:50
    _row("c", REFUND, NOW + timedelta(minutes=50))  # 15:10
    _row("d", CLOSE, NOW + timedelta(hours=23, minutes=50))  # 14:10 tomorrow
    _row("late", CLOSE, NOW - timedelta(minutes=1))  # overdue: not in the next 24 h
    _row("far", CLOSE, NOW + timedelta(hours=24))
    _row("gone", CLOSE, NOW + timedelta(minutes=5), state="cancelled")
    with CaptureQueriesContext(connection) as queries:
        counted = pending_per_hour(DelayedTask.objects.all(), now=NOW, tz=paris)
    assert len(queries) == 1
    assert counted.tz_name == "Europe/Paris" and counted.hours[0].hour == 14
    assert _nonzero(counted.hours, counted.series) == {
        (CLOSE, "Tue 14:00"): 2, (REFUND, "Tue 15:00"): 1, (CLOSE, "Wed 14:00"): 1}


@pytest.mark.django_db
@pytest.mark.usefixtures("shop_delayq")  # the page reads what is paused
def test_changelist_shows_the_chart_with_the_counts_of_pending_rows(admin_client):
    now = timezone.now()
    two_hours_on = (now + timedelta(hours=2)).replace(minute=10, second=0, microsecond=0)
    for n in range(3):  # within one hour, whatever the minute now
        _row(f"order:{n}", CLOSE, two_hours_on + timedelta(minutes=n))
    _row("refund:1", REFUND, now + timedelta(hours=5))
    _row("refund:2", REFUND, now + timedelta(hours=30))  # beyond 24 h
    _row("order:9", CLOSE, now + timedelta(hours=1), state="succeeded")
    response = admin_client.get(reverse(CHANGELIST))
    html = response.content.decode()
    chart = response.context["delayq_chart"]
    assert chart.total == 4 and chart.tasks == [CLOSE, REFUND]
    assert sorted(row[1] for row in chart.rows) == [[0, 1], [3, 0]]
    start = html.index('<svg xmlns="http://www.w3.org/2000/svg" class="delayq-chart"')
    svg = html[start:html.index("</svg>", start) + 6]
    assert sorted(int(b.get("data-count")) for b in _bars(svg)) == [1, 3]
    assert "Pending tasks per hour, next 24 hours" in html and "4 tasks" in html
    assert 'id="result_list"' in html, "the list itself is still there"


@pytest.mark.django_db
@pytest.mark.usefixtures("shop_delayq")  # the page reads what is paused
def test_changelist_chart_follows_the_lists_filters(admin_client):
    now = timezone.now()
    _row("order:1", CLOSE, now + timedelta(hours=2))
    _row("refund:1", REFUND, now + timedelta(hours=3))
    response = admin_client.get(reverse(CHANGELIST), {"task": REFUND})
    assert response.context["delayq_chart"].tasks == [REFUND]
    assert "with the list's filters" in response.content.decode()


@pytest.mark.django_db
@pytest.mark.usefixtures("shop_delayq")  # the page reads what is paused
def test_changelist_without_pending_work_says_so(admin_client):
    html = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert EMPTY_MESSAGE in html and "The numbers" not in html


def _row(job_id: str, task: str, due: datetime, state: str = "scheduled") -> DelayedTask:
    return DelayedTask.objects.create(job_id=job_id, task=task, due=due, state=state)


def _nonzero(hours, series) -> dict[tuple[str, str], int]:
    return {(task, f"{hours[i]:%a %H:%M}"): n
            for task, counts in series.items() for i, n in enumerate(counts) if n}


@pytest.mark.parametrize("first", [22, 23, 16])
def test_a_day_change_is_marked_by_a_line_and_the_new_date_at_midnight(first):
    start = NOW.replace(hour=first, minute=0)
    hours = [start + timedelta(hours=i) for i in range(24)]
    root = ET.fromstring(render_svg(hours, {CLOSE: [1] * len(hours)}, tz_name="UTC"))
    midnight = next(i for i, h in enumerate(hours) if h.hour == 0)
    [line] = root.findall(f"{SVG}line[@class='midnight']")
    slot = [float(r.get("x")) for r in _bars(ET.tostring(root).decode())]
    assert slot[midnight - 1] < float(line.get("x1")) < slot[midnight], "between the days"
    days = {t.text: float(t.get("x")) for t in root.iter(f"{SVG}text")
            if t.get("class") == "day"}
    assert days["Wed 2025-03-12"] == pytest.approx(float(line.get("x1")) + 3)
    if midnight >= 4:  # room for the first day's date too
        assert "Tue 2025-03-11" in days


def test_the_date_of_a_midnight_at_the_right_edge_stays_inside_the_chart():
    hours = [NOW.replace(hour=1, minute=0) + timedelta(hours=i) for i in range(24)]
    root = ET.fromstring(render_svg(hours, {CLOSE: [1] * 24}))
    [line] = root.findall(f"{SVG}line[@class='midnight']")
    [day] = [t for t in root.iter(f"{SVG}text") if t.text == "Wed 2025-03-12"]
    assert day.get("text-anchor") == "end", "it ends left of the line, not past the edge"
    assert float(day.get("x")) == pytest.approx(float(line.get("x1")) - 3, abs=0.11)
