"""The admin's chart of pending work: delayed tasks due per hour in the next 24 h, per task.

``pending_per_hour`` counts the mirror's rows with one aggregate query; ``render_svg`` is a pure
function from those counts to an inline SVG (stacked bars, legend, axis labels, a ``<title>``
on every bar segment), so the page needs no JavaScript and nothing from the network.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from datetime import timezone as dt_timezone

from django.db.models import Count, QuerySet
from django.db.models.functions import TruncHour
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from .models import State
from .times import from_db, to_db

#: Okabe-Ito colours (distinguishable with colour-blindness), then grey for "other tasks".
COLOURS = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00")
OTHER_COLOUR = "#999999"
OTHER = "other tasks"
EMPTY_MESSAGE = "No pending tasks due in the next 24 hours."
TITLE = "Pending delayed tasks per hour, next 24 hours"

WIDTH, PLOT_LEFT, PLOT_RIGHT, PLOT_TOP, PLOT_HEIGHT = 720, 44, 10, 16, 140
AXIS_HEIGHT, LEGEND_ROW, CHAR_WIDTH = 54, 18, 6.4
DAY_LABEL_WIDTH = 100  # "Wed 2025-03-12" at 11 px, and a gap


@dataclass(frozen=True)
class PendingHours:
    """Pending jobs per task for each clock hour (aware, in ``tz``) of a window."""

    hours: list[datetime]
    series: dict[str, list[int]]
    tz_name: str


@dataclass(frozen=True)
class PendingChart:
    """What the changelist template shows: the SVG and the same numbers as table rows."""

    svg: SafeString
    tasks: list[str]
    rows: list[tuple[str, list[int], int]]
    total: int


def hour_buckets(start: datetime, end: datetime, tz: tzinfo) -> list[datetime]:
    """Clock hours in ``tz`` that overlap ``[start, end)``, each as its aware local start."""
    first = timezone.localtime(start, tz).replace(minute=0, second=0, microsecond=0)
    hours, seen, at = [], set(), first.astimezone(dt_timezone.utc)
    while at < end:
        local = at.astimezone(tz).replace(minute=0, second=0, microsecond=0)
        if _wall(local) not in seen:  # a repeated hour at a DST change is one bucket
            seen.add(_wall(local))
            hours.append(local)
        at += timedelta(hours=1)
    return hours


def pending_per_hour(queryset: QuerySet, *, now: datetime | None = None, hours: int = 24,
                     tz: tzinfo | None = None) -> PendingHours:
    """Count ``queryset``'s scheduled rows due in the next ``hours`` per clock hour and task.

    One ``GROUP BY`` query; ``tz`` defaults to the current (the user's) time zone.
    """
    tz = tz or timezone.get_current_timezone()
    now = now or from_db(timezone.now())
    end = now + timedelta(hours=hours)
    buckets = hour_buckets(now, end, tz)
    index = {_wall(hour): i for i, hour in enumerate(buckets)}
    counts = (queryset.filter(state=State.SCHEDULED, due__gte=to_db(now), due__lt=to_db(end))
              .annotate(hour=TruncHour("due", tzinfo=tz)).order_by()
              .values("hour", "task").annotate(n=Count("pk"))
              .values_list("hour", "task", "n"))
    series: dict[str, list[int]] = {}
    for hour, task, n in counts:
        i = index.get(_wall(timezone.localtime(from_db(hour), tz)))
        if i is not None:
            series.setdefault(task, [0] * len(buckets))[i] += n
    return PendingHours(buckets, series, str(tz))


def pending_chart(queryset: QuerySet, *, now: datetime | None = None,
                  tz: tzinfo | None = None, max_series: int = len(COLOURS)) -> PendingChart:
    """The chart and table of ``queryset``'s pending work in the next 24 h."""
    counted = pending_per_hour(queryset, now=now, tz=tz)
    series = top_series(counted.series, max_series)
    svg = render_svg(counted.hours, series, tz_name=counted.tz_name)
    rows = []
    for i, hour in enumerate(counted.hours):
        cells = [counts[i] for counts in series.values()]
        if sum(cells):
            rows.append((f"{hour:%a %H:%M}", cells, sum(cells)))
    return PendingChart(svg, list(series), rows, sum(row[2] for row in rows))


def top_series(series: Mapping[str, Sequence[int]], keep: int) -> dict[str, list[int]]:
    """The ``keep`` tasks with most jobs, biggest first; the rest summed as "other tasks"."""
    ranked = sorted(series.items(), key=lambda item: (-sum(item[1]), item[0]))
    top = {task: list(counts) for task, counts in ranked[:keep]}
    if len(ranked) > keep:
        top[OTHER] = [sum(column) for column in zip(*(c for _, c in ranked[keep:]), strict=True)]
    return top


def render_svg(hours: Sequence[datetime], series: Mapping[str, Sequence[int]], *,
               tz_name: str = "", title: str = TITLE) -> SafeString:
    """Stacked bars of ``series`` (task -> count per hour of ``hours``) as an inline SVG.

    Bar heights are proportional to the counts; every segment has a ``<title>`` with its
    hour, task and count, and the SVG's ``<desc>`` sums it up for screen readers.
    """
    totals = [sum(column) for column in zip(*series.values(), strict=True)] or [0] * len(hours)
    colours = {task: OTHER_COLOUR if task == OTHER else COLOURS[i % len(COLOURS)]
               for i, task in enumerate(series)}
    legend, legend_height = _legend(colours)
    axis_y = PLOT_TOP + PLOT_HEIGHT
    height = axis_y + AXIS_HEIGHT + legend_height
    parts = [f'<title id="delayq-chart-title">{escape(title)}</title>',
             f'<desc id="delayq-chart-desc">{escape(_summary(hours, series, tz_name))}</desc>',
             "<style>.delayq-chart text{fill:var(--body-fg,#333);font:11px sans-serif}"
             ".delayq-chart .grid{stroke:var(--hairline-color,#ddd)}</style>"]
    if not any(totals):
        parts.append(f'<text class="empty" x="{WIDTH / 2}" y="{PLOT_TOP + PLOT_HEIGHT / 2}" '
                     f'text-anchor="middle">{escape(EMPTY_MESSAGE)}</text>')
    else:
        parts += _y_axis(max(totals))
        parts += _bars(hours, series, colours, totals, max(totals))
        parts += legend
    parts += _x_axis(hours, tz_name)
    return mark_safe(
        f'<svg xmlns="http://www.w3.org/2000/svg" class="delayq-chart" role="img" '
        f'aria-labelledby="delayq-chart-title delayq-chart-desc" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}">{"".join(parts)}</svg>')


def _wall(moment: datetime) -> datetime:
    return moment.replace(tzinfo=None, fold=0)


def _nice_top(peak: int) -> tuple[int, int]:
    """An axis maximum >= ``peak`` and a tick step of 1, 2 or 5 times a power of ten."""
    rough = max(peak / 4, 1)
    power = 10 ** math.floor(math.log10(rough))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= rough)
    return step * math.ceil(peak / step), step


def _scale(count: int, top: int) -> float:
    return PLOT_HEIGHT * count / top


def _y_axis(peak: int) -> list[str]:
    top, step = _nice_top(peak)
    parts = []
    for tick in range(0, top + 1, step):
        y = PLOT_TOP + PLOT_HEIGHT - _scale(tick, top)
        parts.append(f'<line class="grid" x1="{PLOT_LEFT}" x2="{WIDTH - PLOT_RIGHT}" '
                     f'y1="{y:.1f}" y2="{y:.1f}"/>'
                     f'<text x="{PLOT_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{tick}</text>')
    return parts


def _bars(hours: Sequence[datetime], series: Mapping[str, Sequence[int]],
          colours: Mapping[str, str], totals: Sequence[int], peak: int) -> list[str]:
    top, _ = _nice_top(peak)
    slot = (WIDTH - PLOT_LEFT - PLOT_RIGHT) / len(hours)
    parts = []
    for i, hour in enumerate(hours):
        x = PLOT_LEFT + i * slot + slot * 0.15
        base: float = PLOT_TOP + PLOT_HEIGHT  # bars stack upwards from the axis
        span = f"{hour:%a %H:%M} to {hour + timedelta(hours=1):%H:%M}"
        for task, counts in series.items():
            if not counts[i]:
                continue
            h = _scale(counts[i], top)
            base -= h
            parts.append(
                f'<rect class="bar" x="{x:.1f}" y="{base:.1f}" width="{slot * 0.7:.1f}" '
                f'height="{h:.1f}" fill="{colours[task]}" data-task="{escape(task)}" '
                f'data-hour="{hour:%H:%M}" data-count="{counts[i]}">'
                f'<title>{escape(span)}: {counts[i]} {escape(task)}</title></rect>')
        if totals[i]:
            parts.append(f'<text class="total" x="{x + slot * 0.35:.1f}" y="{base - 3:.1f}" '
                         f'text-anchor="middle">{totals[i]}</text>')
    return parts


def _x_axis(hours: Sequence[datetime], tz_name: str) -> list[str]:
    """Hour labels every third clock hour; at each midnight a line through the plot and the
    new date beside it, and the first hour's date where that leaves it room."""
    axis_y = PLOT_TOP + PLOT_HEIGHT
    slot = (WIDTH - PLOT_LEFT - PLOT_RIGHT) / max(len(hours), 1)
    parts = [f'<line x1="{PLOT_LEFT}" x2="{WIDTH - PLOT_RIGHT}" y1="{axis_y}" y2="{axis_y}" '
             f'stroke="#888"/>']
    midnights = [i for i, hour in enumerate(hours) if i and hour.hour == 0]
    for i, hour in enumerate(hours):
        x = PLOT_LEFT + (i + 0.5) * slot
        if i == 0 or (hour.hour % 3 == 0 and i >= 2):  # no label crowding the first one
            parts.append(f'<text class="hour" x="{x:.1f}" y="{axis_y + 14}" '
                         f'text-anchor="middle">{hour:%H:%M}</text>')
    if not midnights or midnights[0] * slot >= DAY_LABEL_WIDTH:
        parts.append(_day_label(PLOT_LEFT, hours[0]) if hours else "")
    for i in midnights:
        x = PLOT_LEFT + i * slot
        parts.append(f'<line class="midnight" x1="{x:.1f}" x2="{x:.1f}" y1="{PLOT_TOP}" '
                     f'y2="{axis_y + 30}" stroke="#888" stroke-dasharray="3 3"/>')
        parts.append(_day_label(x + 3, hours[i]))
    caption = f"hour due, times in {tz_name}" if tz_name else "hour due"
    parts.append(f'<text class="caption" x="{(PLOT_LEFT + WIDTH - PLOT_RIGHT) / 2}" '
                 f'y="{axis_y + 42}" text-anchor="middle">{escape(caption)}</text>')
    return parts


def _day_label(x: float, hour: datetime) -> str:
    """The date of ``hour`` from ``x`` on, or ending at ``x - 6`` where it would leave the
    chart (``x`` is 3 px right of a midnight line: the date then ends 3 px left of it)."""
    anchor = "start"
    if x + DAY_LABEL_WIDTH > WIDTH:
        x, anchor = x - 6, "end"
    return (f'<text class="day" x="{x:.1f}" y="{PLOT_TOP + PLOT_HEIGHT + 27}" '
            f'text-anchor="{anchor}">{hour:%a %Y-%m-%d}</text>')


def _legend(colours: Mapping[str, str]) -> tuple[list[str], int]:
    """Legend items flowed left to right in rows; returns the parts and their height."""
    parts: list[str] = []
    x: float = PLOT_LEFT
    row = 0
    for task, colour in colours.items():
        width = 18 + len(task) * CHAR_WIDTH + 16
        if x + width > WIDTH - PLOT_RIGHT and x > PLOT_LEFT:
            x, row = PLOT_LEFT, row + 1
        y = PLOT_TOP + PLOT_HEIGHT + AXIS_HEIGHT + row * LEGEND_ROW
        parts.append(f'<g class="legend-item"><rect x="{x:.1f}" y="{y}" width="12" height="12" '
                     f'fill="{colour}"/><text x="{x + 18:.1f}" y="{y + 10}">{escape(task)}'
                     f'</text></g>')
        x += width
    return parts, (row + 1) * LEGEND_ROW if colours else 0


def _summary(hours: Sequence[datetime], series: Mapping[str, Sequence[int]],
             tz_name: str) -> str:
    totals = [sum(column) for column in zip(*series.values(), strict=True)]
    if not any(totals):
        return EMPTY_MESSAGE
    per_task = ", ".join(f"{sum(counts)} {task}" for task, counts in series.items())
    busiest = max(range(len(totals)), key=totals.__getitem__)
    return (f"{sum(totals)} pending tasks in the next 24 hours: {per_task}. Busiest hour: "
            f"{hours[busiest]:%a %H:%M} with {totals[busiest]}"
            f"{f' (times in {tz_name})' if tz_name else ''}.")
