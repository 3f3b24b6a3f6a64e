"""Bar charts of a series per day, drawn on the server as inline SVG (no script, no CDN): a
title and description for screen readers (role="img", aria-labelledby), a labelled value axis
and day axis; the page gives the same numbers in a table beside each chart. Every text reaching
the SVG is escaped here."""

from dataclasses import dataclass
from html import escape

from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 16, 40


@dataclass(frozen=True)
class Bar:
    label: str  # the day, "2026-12-01"
    value: float


def _nice_top(peak: float) -> float:
    """A round axis maximum at or above `peak` (1, 2, 2.5, 5 × 10^n)."""
    if peak <= 0:
        return 1.0
    magnitude = 1.0
    while magnitude * 10 <= peak:
        magnitude *= 10
    while magnitude > peak:
        magnitude /= 10
    for step in (1, 2, 2.5, 5, 10):
        if step * magnitude >= peak:
            return step * magnitude
    return 10 * magnitude


def _short(value: float, unit: str) -> str:
    if unit == "bytes":
        for factor, suffix in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if value >= factor:
                return f"{value / factor:.3g} {suffix}"
        return f"{value:.0f} B"
    if unit == "usd":
        return f"${value:.4g}"
    if value >= 1_000_000:
        return f"{value / 1_000_000:.3g}M"
    if value >= 1000:
        return f"{value / 1000:.3g}k"
    return f"{value:.3g}"


def bars_svg(*, chart_id: str, title: str, unit: str, axis_label: str,
             bars: list[Bar]) -> SafeString:
    """One chart; `unit` ("count", "usd", "bytes") formats the axis and each bar's tooltip."""
    peak = max((bar.value for bar in bars), default=0.0)
    top = _nice_top(peak)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(1, len(bars))
    total = sum(bar.value for bar in bars)
    desc = (f"{len(bars)} days from {bars[0].label} to {bars[-1].label}; total "
            f"{_short(total, unit)}, highest day {_short(peak, unit)}." if bars else "No days.")
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-labelledby="{chart_id}-title {chart_id}-desc">',
        f'<title id="{chart_id}-title">{escape(title)}</title>',
        f'<desc id="{chart_id}-desc">{escape(desc)}</desc>',
    ]
    for i in range(5):  # gridlines and value labels
        value = top * i / 4
        y = TOP + plot_h - plot_h * i / 4
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                     'class="grid"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">'
                     f'{escape(_short(value, unit))}</text>')
    every = max(1, len(bars) // 8)  # a day label every few bars: they must not overlap
    for index, bar in enumerate(bars):
        h = plot_h * (bar.value / top)
        x = LEFT + index * slot + slot * 0.15
        parts.append(f'<rect x="{x:.1f}" y="{TOP + plot_h - h:.1f}" width="{slot * 0.7:.1f}" '
                     f'height="{h:.1f}" class="bar"><title>{escape(bar.label)}: '
                     f'{escape(_short(bar.value, unit))}</title></rect>')
        if index % every == 0:
            parts.append(f'<text x="{x + slot * 0.35:.1f}" y="{HEIGHT - BOTTOM + 14}" '
                         f'text-anchor="middle" class="tick">{escape(bar.label[5:])}</text>')
    parts.append(f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 6}" text-anchor="middle" '
                 'class="axis">Day (UTC, month-day)</text>')
    parts.append(f'<text transform="translate(14 {TOP + plot_h / 2:.1f}) rotate(-90)" '
                 f'text-anchor="middle" class="axis">{escape(axis_label)}</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))
