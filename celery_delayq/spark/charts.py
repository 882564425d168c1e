"""Small inline-SVG charts for the HTML report: no JavaScript, no CDN, no plotting library."""

from __future__ import annotations

from html import escape

_W, _H, _LEFT, _BOTTOM, _TOP, _RIGHT = 900, 260, 64, 56, 28, 110
_COLOURS = ("#1f77b4", "#ff7f0e", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#7f7f7f")


def _frame(title: str, top: float, labels: list[str]) -> list[str]:
    plot_h = _H - _TOP - _BOTTOM
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" '
             f'role="img" aria-label="{escape(title)}">',
             f'<text x="{_LEFT}" y="18" font-size="14" font-weight="600">{escape(title)}</text>']
    for i in range(5):
        value = top * i / 4
        y = _TOP + plot_h - plot_h * i / 4
        parts.append(f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                     'stroke="#e5e5e5"/>')
        parts.append(f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" font-size="11" '
                     f'text-anchor="end">{value:,.4g}</text>')
    step = max(1, len(labels) // 12)
    for i, label in enumerate(labels):
        if i % step == 0:
            x = _x(i, len(labels))
            parts.append(f'<text x="{x:.1f}" y="{_H - _BOTTOM + 16}" font-size="10" '
                         f'text-anchor="middle">{escape(label)}</text>')
    return parts


def _x(i: int, n: int) -> float:
    width = _W - _LEFT - _RIGHT
    return _LEFT + width * (i + 0.5) / max(n, 1)


def _y(value: float, top: float) -> float:
    plot_h = _H - _TOP - _BOTTOM
    return _TOP + plot_h - plot_h * value / top


def _legend(names: list[str]) -> list[str]:
    parts = []
    for i, name in enumerate(names):
        y = _TOP + 16 * i
        colour = _COLOURS[i % len(_COLOURS)]
        parts.append(f'<rect x="{_W - _RIGHT + 12}" y="{y}" width="10" height="10" '
                     f'fill="{colour}"/>')
        parts.append(f'<text x="{_W - _RIGHT + 26}" y="{y + 9}" font-size="11">'
                     f'{escape(name)}</text>')
    return parts


def lines(title: str, labels: list[str], series: dict[str, list[float | None]]) -> str:
    """A line chart, one line per series over ``labels``; gaps where a value is None."""
    values = [v for vs in series.values() for v in vs if v is not None]
    if not values:
        return f"<p>{escape(title)}: no data.</p>"
    top = max(max(values), 1e-9) * 1.1
    parts = _frame(title, top, labels)
    for i, (name, points) in enumerate(series.items()):
        colour = _COLOURS[i % len(_COLOURS)]
        coords = [(_x(j, len(labels)), _y(v, top)) for j, v in enumerate(points)
                  if v is not None]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" '
                     f'points="{path}"><title>{escape(name)}</title></polyline>')
        parts += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"/>'
                  for x, y in coords]
    parts += _legend(list(series))
    parts.append("</svg>")
    return "".join(parts)


def stacked_bars(title: str, labels: list[str], series: dict[str, list[int]]) -> str:
    """A stacked bar per label, one segment per series (counts)."""
    totals = [sum(vs[j] or 0 for vs in series.values()) for j in range(len(labels))]
    if not labels or not any(totals):
        return f"<p>{escape(title)}: no data.</p>"
    top = max(totals) * 1.1
    parts = _frame(title, top, labels)
    bar = (_W - _LEFT - _RIGHT) / len(labels) * 0.6
    for j in range(len(labels)):
        base = 0.0
        for i, (name, counts) in enumerate(series.items()):
            value = counts[j] or 0
            if not value:
                continue
            y_top, y_base = _y(base + value, top), _y(base, top)
            parts.append(
                f'<rect x="{_x(j, len(labels)) - bar / 2:.1f}" y="{y_top:.1f}" '
                f'width="{bar:.1f}" height="{y_base - y_top:.1f}" '
                f'fill="{_COLOURS[i % len(_COLOURS)]}"><title>{escape(labels[j])} '
                f'{escape(name)}: {value:,}</title></rect>')
            base += value
    parts += _legend(list(series))
    parts.append("</svg>")
    return "".join(parts)
