"""How the console shows a value to a person: dates and durations, not epoch milliseconds; words, not Python reprs
(``None``, ``False``, ``['orders']``). Jinja filters, registered by pages.py."""

from __future__ import annotations

import time
from typing import Any

EPOCH_MS_MIN = 10**12      # a millisecond count at least this large is a moment (2001 on), smaller ones are durations
NOTHING = "—"


def utc(ms: int | float) -> str:
    """A moment as a UTC date and time, to the millisecond."""
    whole, part = divmod(int(ms), 1000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(whole)) + f".{part:03d} UTC"


def clock(ms: int | float, span_ms: int | float | None = None) -> str:
    """A moment's time of day in UTC (a timeline's ticks: the axis's ends carry the dates), to the second, or to the
    millisecond on an axis that spans less than a minute (its ticks would read alike)."""
    whole, part = divmod(int(ms), 1000)
    text = time.strftime("%H:%M:%S", time.gmtime(whole))
    return text + f".{part:03d}" if span_ms is not None and span_ms < 60_000 else text


def duration(ms: int | float) -> str:
    """A span of milliseconds in the unit a person reads it in."""
    ms = float(ms)
    if abs(ms) < 1000:
        return f"{ms:g} ms"
    if abs(ms) < 120_000:
        return f"{ms / 1000:.1f} s"
    if abs(ms) < 7_200_000:
        return f"{ms / 60_000:.1f} min"
    return f"{ms / 3_600_000:.1f} h"


def show(value: Any) -> str:
    """Any value of an API answer as text: nothing as a dash, booleans as yes/no, lists joined, mappings as pairs."""
    if value is None:
        return NOTHING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple, set)):
        return ", ".join(show(v) for v in value) or NOTHING
    if isinstance(value, dict):
        return " · ".join(f"{k} {field(v, str(k))}" for k, v in sorted(value.items())) or NOTHING
    return str(value)


def field(value: Any, key: str) -> str:
    """``value`` of the field named ``key``: a ``*_ms`` (or ``ts``) number is a moment or a duration by its size."""
    if (key == "ts" or key.endswith("_ms")) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return utc(value) if value >= EPOCH_MS_MIN else duration(value)
    return show(value)


def register(filters: dict) -> None:
    filters.update(utc=utc, clock=clock, duration=duration, show=show, field=field)
