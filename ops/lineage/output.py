"""Lineage answers for people: a small aligned table per answer (``--json`` prints the documents themselves)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

COLUMNS = {
    "locate": ("topic", "queue", "offset", "broker", "physical_queue", "physical_offset", "gen", "from", "to"),
    "route-at": ("queue", "broker", "physical_queue", "gen"),
    "moves": ("topic", "queue", "from", "to", "gen", "version", "ts"),
    "locks": ("group", "topic", "queue", "member", "token", "from", "to"),
    "verify": ("kind", "message"),
}


def table(columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> str:
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def for_people(command: str, answer: Any) -> str:
    if command == "locate":
        return table(COLUMNS[command], [answer])
    if command == "route-at":
        return f"{answer['topic']} at {answer['at']}\n" + table(COLUMNS[command], answer["queues"])
    if command in ("moves", "locks"):
        return table(COLUMNS[command], answer[command])
    if command == "verify":
        return table(COLUMNS[command], answer) if answer else "no findings"
    raise ValueError(command)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)
