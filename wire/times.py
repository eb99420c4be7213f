"""ISO-8601 UTC times in and out, one format for every command that prints or parses a time (the admin CLI, lineage).

Spark's timestamps cross into Python as microseconds since the epoch (``unix_micros``),
never as ``datetime``: PySpark turns a collected timestamp into the Python process's local time, whatever the
session's time zone says."""

from __future__ import annotations

from datetime import datetime, timezone


def parse_iso(text: str) -> int:
    """Microseconds since the epoch of an ISO-8601 time; a time without an offset is taken as UTC."""
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO-8601 time (e.g. 2026-11-24T08:15:00Z)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    delta = t - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def iso(micros: int | None) -> str | None:
    """``2026-11-24T08:15:00.123Z`` (microseconds shown only when there are any: event times are milliseconds)."""
    if micros is None:
        return None
    t = datetime.fromtimestamp(micros // 1_000_000, tz=timezone.utc).replace(microsecond=micros % 1_000_000)
    spec = "milliseconds" if micros % 1000 == 0 else "microseconds"
    return t.isoformat(timespec=spec).replace("+00:00", "Z")
