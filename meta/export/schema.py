"""The Parquet layout of an export: two tables of events, their Arrow schemas, and how a stored event becomes a row;
and one table of what the brokers held when the export last ran.

- ``mapping_events``: every event that is not a group's (brokers, topics, segments, budgets), with the keys lineage
  queries join on (topic, queue, gen, broker) as columns beside the whole event as JSON;
- ``lock_events``: the events of consumer groups (meta/events.py GROUP_EVENTS): members joining and leaving, lock
  grants, revocations and releases, with group, topic, queue, member, token and reason as columns;
- ``queue_ends``: each logic queue's end (its next logic offset) as the broker holding its head answered during the
  last export run, with when (``observed``) and the route version it was read at. The log records offset budgets,
  never writes: without it an offset past a queue's last message was located in the budget of its head segment as
  if it had been written (issue 35). Replaced whole by each run (``queue_ends/part.parquet``); a queue whose broker
  did not answer has no row.

Both carry ``schema_version`` (this file's layout version) and ``ts`` as microseconds UTC: Spark refuses Parquet
timestamps in nanoseconds. Columns are only ever added, nullable, under a new SCHEMA_VERSION.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa

from ..events import GROUP_EVENTS

SCHEMA_VERSION = 1
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
MAPPING = "mapping_events"
LOCKS = "lock_events"
ENDS = "queue_ends"

_COMMON = [
    pa.field("version", pa.int64(), nullable=False),
    pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("type", pa.string(), nullable=False),
    pa.field("event_schema", pa.int32(), nullable=False),   # the event's own schema version (``v``)
]
_TAIL = [pa.field("data", pa.string(), nullable=False), pa.field("schema_version", pa.int32(), nullable=False)]

SCHEMAS = {
    MAPPING: pa.schema([*_COMMON, pa.field("topic", pa.string()), pa.field("queue", pa.int32()),
                        pa.field("gen", pa.int64()), pa.field("broker", pa.string()), *_TAIL]),
    LOCKS: pa.schema([*_COMMON, pa.field("group", pa.string()), pa.field("topic", pa.string()),
                      pa.field("queue", pa.int32()), pa.field("member", pa.string()), pa.field("token", pa.int64()),
                      pa.field("reason", pa.string()), *_TAIL]),
}
ENDS_SCHEMA = pa.schema([pa.field("topic", pa.string(), nullable=False), pa.field("queue", pa.int32(), nullable=False),
                         pa.field("max_offset", pa.int64(), nullable=False),
                         pa.field("observed", pa.timestamp("us", tz="UTC"), nullable=False),
                         pa.field("route_version", pa.int64(), nullable=False),
                         pa.field("schema_version", pa.int32(), nullable=False)])
_KEYS = {MAPPING: ("topic", "queue", "gen", "broker"), LOCKS: ("group", "topic", "queue", "member", "token", "reason")}


def table_of(event: dict[str, Any]) -> str:
    return LOCKS if event["type"] in GROUP_EVENTS else MAPPING


def day_of(event: dict[str, Any]) -> str:
    """The UTC day partition of an event, from its leader timestamp (ms)."""
    return datetime.fromtimestamp(event["ts"] / 1000, tz=timezone.utc).strftime("%Y-%m-%d")


def row(table: str, event: dict[str, Any]) -> dict[str, Any]:
    data = event["data"]
    out = {"version": event["version"], "ts": event["ts"] * 1000, "type": event["type"], "event_schema": event["v"],
           "data": json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False),
           "schema_version": SCHEMA_VERSION}
    for k in _KEYS[table]:
        out[k] = data.get(k)
    if out.get("topic") is None:
        out["topic"] = event.get("topic")
    return out


def arrow_table(table: str, rows: list[dict[str, Any]]) -> pa.Table:
    schema = SCHEMAS[table]
    columns = {f.name: [r[f.name] for r in rows] for f in schema}
    columns["ts"] = pa.array(columns["ts"], pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    return pa.table(columns, schema=schema)


def ends_table(rows: list[dict[str, Any]]) -> pa.Table:
    """``rows``: {topic, queue, max_offset, observed (ms), route_version}."""
    return pa.table({"topic": [r["topic"] for r in rows], "queue": [r["queue"] for r in rows],
                     "max_offset": [r["max_offset"] for r in rows],
                     "observed": pa.array([r["observed"] * 1000 for r in rows], pa.int64()).cast(
                         pa.timestamp("us", tz="UTC")),
                     "route_version": [r["route_version"] for r in rows],
                     "schema_version": [SCHEMA_VERSION] * len(rows)}, schema=ENDS_SCHEMA)


def stored_event(r: dict[str, Any]) -> dict[str, Any]:
    """The stored event a row of either table was made from (the inverse of ``row``): what a projection rebuild
    takes from an export. ``ts`` goes back to milliseconds; the topic is the one the data names, as in the log."""
    data = json.loads(r["data"])
    ts = r["ts"]
    # Integer arithmetic: a float of microseconds since 1970 can round off the last digit, and so the millisecond.
    ts_us = (ts - _EPOCH) // timedelta(microseconds=1) if isinstance(ts, datetime) else int(ts)
    return {"version": r["version"], "ts": ts_us // 1000, "type": r["type"], "v": r["event_schema"],
            "topic": data.get("topic"), "data": data}
