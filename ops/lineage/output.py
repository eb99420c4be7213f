"""Lineage answers for people: a small aligned table per answer (``--json`` prints the documents themselves)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..admin import output as admin_output

COLUMNS = {
    "locate": ("topic", "queue", "offset", "broker", "physical_queue", "physical_offset", "gen", "from", "to"),
    "route-at": ("queue", "broker", "physical_queue", "gen"),
    "moves": ("topic", "queue", "from", "to", "gen", "version", "ts"),
    "locks": ("group", "topic", "queue", "member", "token", "from", "to"),
    "verify": ("kind", "message"),
}


def table(columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> str:
    """The admin CLI's aligned table, with the answer's field names as headers."""
    return admin_output.table(rows, [(c, c) for c in columns])


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
