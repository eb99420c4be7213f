"""How the admin CLI prints: aligned tables for people, one JSON document for scripts, one line per error.

``-w json`` prints exactly one JSON document per command (the HTTP answer's shape where one exists); the two streams
(``route --watch``, ``history --follow``) print one document per line (JSON Lines), one per version or event.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn

import click

from wire.times import iso

EXIT_ERROR = 1
CELL_CHARS_MAX = 60   # a longer cell (a long config value, an error) is cut: a table row stays one readable line

Row = Mapping[str, Any]
Column = tuple[str, str | Callable[[Row], Any]]   # (header, key of the row or a function of it)


def fail(code: str, message: str) -> NoReturn:
    # One line, whatever the message holds: scripts read stderr line by line.
    click.echo(f"error: {code}: {' '.join(str(message).split())}", err=True)
    sys.exit(EXIT_ERROR)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


def emit_json_line(data: Any) -> None:
    click.echo(json.dumps(data, separators=(",", ":")))


def emit(json_out: bool, data: Any, as_text: Callable[[Any], str]) -> None:
    """``data`` as one JSON document, or as the text ``as_text`` makes of it."""
    if json_out:
        emit_json(data)
    else:
        click.echo(as_text(data))


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    scalar = (str, int, float)
    if isinstance(value, (list, tuple)) and all(isinstance(v, scalar) for v in value):
        text = ",".join(str(v) for v in value) or "-"
    elif isinstance(value, dict) and all(isinstance(v, scalar) for v in value.values()):
        text = ",".join(f"{k}={v}" for k, v in value.items()) or "-"
    elif isinstance(value, (list, tuple, dict)):
        text = json.dumps(value, separators=(",", ":")) if value else "-"
    else:
        text = str(value)
    return text if len(text) <= CELL_CHARS_MAX else text[:CELL_CHARS_MAX - 3] + "..."


def table(rows: Iterable[Row], columns: Sequence[Column]) -> str:
    """Rows under upper-case headers, each column as wide as its widest cell, two spaces apart."""
    cells = [[h.upper() for h, _ in columns]]
    for r in rows:
        cells.append([cell(key(r) if callable(key) else r.get(key)) for _, key in columns])
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cells)


def fields(pairs: Sequence[tuple[str, Any]]) -> str:
    """``name: value`` lines, names aligned (the head of a describe)."""
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{(k + ':').ljust(width + 1)} {cell(v)}" for k, v in pairs)


def when(ms: int | None) -> str | None:
    """Milliseconds since the epoch (the API's ``ts``) as ISO-8601 UTC, in the one format of ops/times.py."""
    return None if ms is None else iso(ms * 1000)
