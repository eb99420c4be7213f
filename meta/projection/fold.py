"""Folding stored events into current-state rows, as a plan of named writes. No I/O: store.py executes the plan.

Each fold reads only its own event, so a whole batch is planned before anything touches the database and
consecutive writes of the same kind go out as one executemany.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..events import GROUP_EVENTS

Op = tuple[str, dict[str, Any]]  # (statement name in statements.py, parameters)
Fold = Callable[[int, int, dict[str, Any]], Iterator[Op]]  # (version, ts, data) -> writes


def _segment_key(d: dict[str, Any]) -> dict[str, Any]:
    return {"k_topic": d["topic"], "k_queue": d["queue"], "k_gen": d["gen"]}


def _gen0_segments(version: int, ts: int, d: dict[str, Any]) -> Iterator[Op]:
    for s in d["segments"]:
        yield "segment_insert", {
            "topic": d["topic"], "queue": s["queue"], "gen": 0, "broker": s["broker"],
            "physical_queue": s["physical_queue"], "physical_start": 0, "logic_start": 0, "logic_end": None,
            "budget_end": s["budget_end"], "state": "active", "opened_version": version, "opened_ms": ts,
            "sealed_ms": None,
        }


def _slot_ranges(d: dict[str, Any]) -> Iterator[Op]:
    for lo, hi, queue in d["slot_table"]:
        yield "slot_range_insert", {"topic": d["topic"], "lo": lo, "hi": hi, "queue": queue}


def broker_registered(version: int, ts: int, d: dict[str, Any]) -> Iterator[Op]:
    yield "broker_upsert", {"broker": d["broker"], "address": d["address"], "zone": d["zone"], "epoch": d["epoch"],
                            "state": "active", "updated_ms": ts}


def broker_fenced(version: int, ts: int, d: dict[str, Any]) -> Iterator[Op]:
    # Only the named session: a late fence of an older epoch must not fence the broker's newer session.
    yield "broker_state", {"k_broker": d["broker"], "k_epoch": d["epoch"], "state": "fenced", "updated_ms": ts}


def broker_unfenced(version: int, ts: int, d: dict[str, Any]) -> Iterator[Op]:
    yield "broker_state", {"k_broker": d["broker"], "k_epoch": d["epoch"], "state": "active", "updated_ms": ts}


def offset_budget_granted(version: int, ts: int, d: dict[str, Any]) -> Iterator[Op]:
    yield "segment_budget", {**_segment_key(d), "budget_end": d["budget_end"]}


def topic_created(version: int, ts: int, d: dict[str, Any]) -> Iterator[Op]:
    yield "topic_insert", {"topic": d["topic"], "incarnation": d["incarnation"], "queues": d["queues"],
                           "slots": d["slots"], "order": d["order"], "config": d["config"], "version": version,
                           "created_ms": ts}
    yield from _gen0_segments(version, ts, d)
    yield from _slot_ranges(d)


def topic_grown(version: int, ts: int, d: dict[str, Any]) -> Iterator[Op]:
    yield "topic_queues", {"k_topic": d["topic"], "queues": d["queues"]}
    yield "slot_ranges_delete", {"k_topic": d["topic"]}
    yield from _slot_ranges(d)
    yield from _gen0_segments(version, ts, d)
    for b in d["barriers"]:
        yield "barrier_insert", {"topic": d["topic"], "queue": b["queue"], "after_queue": b["after_queue"],
                                 "after_gen": b["after_gen"]}


def topic_config_changed(version: int, ts: int, d: dict[str, Any]) -> Iterator[Op]:
    yield "topic_config", {"k_topic": d["topic"], "config": d["config"]}


def topic_deleted(version: int, ts: int, d: dict[str, Any]) -> Iterator[Op]:
    for name in ("segments_delete", "slot_ranges_delete", "barriers_delete", "topics_delete"):
        yield name, {"k_topic": d["topic"]}


def segment_sealing(version: int, ts: int, d: dict[str, Any]) -> Iterator[Op]:
    yield "segment_sealing", _segment_key(d)


def segment_sealed(version: int, ts: int, d: dict[str, Any]) -> Iterator[Op]:
    yield "segment_sealed", {**_segment_key(d), "logic_end": d["logic_end"], "sealed_ms": ts}


def segment_opened(version: int, ts: int, d: dict[str, Any]) -> Iterator[Op]:
    # logic_start stays NULL until LogicStartDecided: the old segment's end is not known yet.
    yield "segment_insert", {
        "topic": d["topic"], "queue": d["queue"], "gen": d["gen"], "broker": d["broker"],
        "physical_queue": d["physical_queue"], "physical_start": d["physical_start"], "logic_start": None,
        "logic_end": None, "budget_end": d["budget_end"], "state": "active", "opened_version": version,
        "opened_ms": ts, "sealed_ms": None,
    }


def logic_start_decided(version: int, ts: int, d: dict[str, Any]) -> Iterator[Op]:
    yield "segment_logic_start", {**_segment_key(d), "logic_start": d["logic_start"]}
    # A barrier waiting on this generation is released at its first logic offset: the split point.
    yield "barrier_after_offset", {**_segment_key(d), "logic_start": d["logic_start"]}


FOLDS: dict[str, Fold] = {
    "BrokerRegistered": broker_registered,
    "BrokerFenced": broker_fenced,
    "BrokerUnfenced": broker_unfenced,
    "OffsetBudgetGranted": offset_budget_granted,
    "TopicCreated": topic_created,
    "TopicGrown": topic_grown,
    "TopicConfigChanged": topic_config_changed,
    "TopicDeleted": topic_deleted,
    "SegmentSealing": segment_sealing,
    "SegmentSealed": segment_sealed,
    "SegmentOpened": segment_opened,
    "LogicStartDecided": logic_start_decided,
}


def _kept_in_history_only(version: int, ts: int, d: dict[str, Any]) -> Iterator[Op]:
    # Group membership and locks are not projected into tables yet: every such event is in the events table
    # (history), which is what the lineage export reads. Tables for dashboards can fold them later.
    return iter(())


FOLDS.update({name: _kept_in_history_only for name in sorted(GROUP_EVENTS)})
# Who is in sync changes often and matters only now: the route shows it, the history keeps every change.
FOLDS["InSyncChanged"] = _kept_in_history_only
# A drain's mark matters only while it runs: the broker listing shows it, the history keeps every change.
FOLDS["BrokerDrainChanged"] = _kept_in_history_only
FOLDS["SegmentCopiesChanged"] = _kept_in_history_only
# The types whose fold reads the event's data: the writer parses the data of no other (store.py apply_lines).
READS_DATA = frozenset(name for name, f in FOLDS.items() if f is not _kept_in_history_only)


@dataclass
class Plan:
    ops: list[Op] = field(default_factory=list)
    # topic -> version of the last event touching it. Written once at the end of the batch instead of once per
    # event: the last write wins anyway, and a per-event write would split every run of equal statements in two.
    topic_versions: dict[str, int] = field(default_factory=dict)
    unknown: set[str] = field(default_factory=set)


def plan(events: Iterable[dict[str, Any]]) -> Plan:
    """The writes that fold these stored events (ascending versions) into the current-state tables."""
    p = Plan()
    for e in events:
        fold = FOLDS.get(e["type"])
        if fold is None:
            # A type this code does not know (a newer node wrote it): keep it in history, change no state.
            p.unknown.add(e["type"])
            continue
        p.ops.extend(fold(e["version"], e["ts"], e["data"]))
        if e["topic"] is not None and e["type"] not in GROUP_EVENTS:  # a lock event leaves its topic's version
            p.topic_versions[e["topic"]] = e["version"]
    return p


def runs(ops: list[Op]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Consecutive ops with the same statement, merged: order between different statements is kept."""
    name, batch = None, []
    for op_name, params in ops:
        if op_name != name and batch:
            yield name, batch
            batch = []
        name = op_name
        batch.append(params)
    if batch:
        yield name, batch
