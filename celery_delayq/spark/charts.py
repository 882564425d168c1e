"""Plotly charts for the HTML report, as HTML fragments. plotly.js goes inline once per page
(:func:`script`), so the page is one file that opens offline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape

_HEIGHT = 360
_CONFIG = {"responsive": True, "displaylogo": False}
_NUMBER = ",~r"  # 12,345 and 0.25: no SI suffixes, no exponents


def script() -> str:
    """A script element holding plotly.js."""
    from plotly.offline import get_plotlyjs

    return f'<script type="text/javascript">{get_plotlyjs()}</script>'


def over_time(div_id: str, title: str, y_title: str, x_title: str,
              series: Mapping[str, tuple[Sequence[datetime], Sequence[float | None]]]) -> str:
    """One line per series on a UTC time axis (round ticks, the date where the day
    changes); a gap where a value is None."""
    import plotly.graph_objects as go

    traces = [go.Scatter(x=[t.strftime("%Y-%m-%d %H:%M") for t in times], y=list(values),
                         name=_text(name), mode="lines+markers", marker={"size": 5})
              for name, (times, values) in series.items()
              if any(v is not None for v in values)]
    if not traces:
        return _no_data(title)
    figure = go.Figure(traces, _layout(title, y_title, x_title))
    figure.update_xaxes(type="date", hoverformat="%Y-%m-%d %H:%M UTC")
    return _html(figure, div_id)


def grouped_bars(div_id: str, title: str, y_title: str, x_title: str, categories: list[str],
                 series: dict[str, list[int]]) -> str:
    """Bars side by side per category, one per series (none stacked on another)."""
    import plotly.graph_objects as go

    traces = [go.Bar(x=[_text(c) for c in categories], y=values, name=_text(name))
              for name, values in series.items()]
    if not any(any(values) for values in series.values()):
        return _no_data(title)
    figure = go.Figure(traces, _layout(title, y_title, x_title))
    figure.update_layout(barmode="group", hovermode="x")
    return _html(figure, div_id)


def _text(label: str) -> str:
    """A label (a task name) as plotly draws text: it reads ``<a href>``, ``<b>``, ``<br>``
    in labels and legend names as markup, so a task name could draw a link."""
    return escape(label, quote=False)


def _layout(title: str, y_title: str, x_title: str) -> dict:
    axis = {"automargin": True, "showline": True, "linecolor": "#bbb"}
    return {
        "template": "plotly_white", "height": _HEIGHT, "hovermode": "x unified",
        "title": {"text": title, "x": 0, "xanchor": "left", "font": {"size": 15}},
        "margin": {"l": 10, "r": 10, "t": 80, "b": 10},
        "legend": {"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"},
        "xaxis": {**axis, "title": {"text": x_title}},
        "yaxis": {**axis, "title": {"text": y_title}, "rangemode": "tozero",
                  "tickformat": _NUMBER},
    }


def _html(figure, div_id: str) -> str:
    return figure.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                          config=_CONFIG, default_width="100%",
                          default_height=f"{_HEIGHT}px")


def _no_data(title: str) -> str:
    return f'<p class="muted">{escape(title)}: no data.</p>'
