"""The structural rules any image of the state machine keeps (DESIGN.md invariants 3, 5 and 7): each queue's chain of
segments (gens one after the other, no gap and no overlap of logic offsets, one writable head), the slot tables, and
the load and hosting counters against a recount.

``problems`` lists what an image breaks, as sentences. The state machine's tests hold every image they build to it
(tests/support/state_machine_builders.py), and the simulator holds every node's final image to it after each
schedule (ops/sim): a decision that numbers a segment wrong breaks no answer at once, only the chain it leaves.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from . import allocation, chains
from .image import Image

PROBLEMS_MAX = 20   # past this many, an image is broken enough: the rest are not listed


def problems(image: Image) -> list[str]:
    """What ``image`` breaks of the rules above (empty: nothing), at most PROBLEMS_MAX."""
    out: list[str] = []
    _topics(image.data, out)
    return out[:PROBLEMS_MAX]


def _topics(data: dict[str, Any], out: list[str]) -> None:
    recount: Counter[str] = Counter()
    hosting: dict[str, Counter[str]] = {}
    physical: set[tuple[str, str]] = set()
    for name, t in data["topics"].items():
        if t["topic"] != name:
            out.append(f"topic {name!r} is stored as {t['topic']!r}")
        if not 0 < t["version"] <= data["version"]:
            out.append(f"{name}: version {t['version']} outside 1..{data['version']}")
        queue_chains = [chain for _q, chain in chains.chains(t)]
        if not len(queue_chains) == t["queues"] <= t["slots"]:
            out.append(f"{name}: {len(queue_chains)} chains for {t['queues']} queues and {t['slots']} slots")
        _slot_table(name, allocation.slot_table(t["slot_table"]), t["slots"], t["queues"], out)
        for q, segs in enumerate(queue_chains):
            _chain(data, f"{name}/{q}", segs, physical, out)
            if segs:
                recount[segs[-1]["broker"]] += 1
            for seg in segs:
                _copies(f"{name}/{q} gen {seg['gen']}", seg, out)
                for b in seg["replicas"]:
                    hosting.setdefault(b, Counter())[name] += 1
        for b in t["barriers"]:
            if not 0 <= b["after_queue"] < b["queue"] < t["queues"]:
                out.append(f"{name}: barrier {b} names queues out of order or out of range")
                continue
            after = [s for s in queue_chains[b["after_queue"]] if s["gen"] == b["after_gen"]]
            if not after:
                out.append(f"{name}: barrier {b} names a segment that does not exist")
            elif b["after_offset"] != after[0]["logic_start"]:
                out.append(f"{name}: barrier {b} is not at the start of the segment it names")
    if data["load"] != dict(recount):
        out.append(f"load counters {data['load']} differ from a recount of the heads {dict(recount)}")
    if data["hosting"] != {b: dict(c) for b, c in hosting.items()}:
        out.append("the hosting index differs from a recount of the replicas")
    if data["history_start"] + len(data["history"]) - 1 != data["version"]:
        out.append(f"history from {data['history_start']} of {len(data['history'])} events does not end at version "
                   f"{data['version']}")


def _slot_table(name: str, table: list[list[int]], slots: int, queues: int, out: list[str]) -> None:
    """Every slot exactly once (sorted, contiguous, no empty range), and every queue owns at least one."""
    lo_expected, owners = 0, set()
    for lo, hi, q in table:
        if lo != lo_expected or lo >= hi:
            out.append(f"{name}: slot table has a gap, an overlap or an empty range at {[lo, hi, q]}")
            return
        owners.add(q)
        lo_expected = hi
    if lo_expected != slots:
        out.append(f"{name}: slot table ends at {lo_expected}, not {slots}")
    if owners != set(range(queues)):
        out.append(f"{name}: slots are owned by {sorted(owners)}, not by every queue and only queues")


def _chain(data: dict[str, Any], where: str, segs: list[dict[str, Any]], physical: set[tuple[str, str]],
           out: list[str]) -> None:
    if not segs:
        out.append(f"{where} has no segment")
        return
    if segs[0]["logic_start"] != 0:
        out.append(f"{where}: the first segment starts at logic offset {segs[0]['logic_start']}, not 0")
    if [s["gen"] for s in segs] != list(range(segs[0]["gen"], segs[0]["gen"] + len(segs))):
        out.append(f"{where}: gens {[s['gen'] for s in segs]} do not follow one another")
    for s in segs:
        key = (s["broker"], s["physical_queue"])
        if key in physical:
            out.append(f"{where}: physical queue {key} used twice")
        physical.add(key)
        if s["state"] == "sealed":
            if s["logic_start"] is None or not s["physical_start"] <= s["physical_end"] <= s["budget_end"] \
                    or s["logic_end"] != s["logic_start"] + s["physical_end"] - s["physical_start"]:
                out.append(f"{where}: sealed gen {s['gen']} has inconsistent ends: {s}")
        elif s["logic_end"] is not None or s["physical_end"] is not None:
            out.append(f"{where}: gen {s['gen']} ({s['state']}) has an end: {s}")
        if s["state"] == "sealing" and data["brokers"][s["sealer"]]["state"] != "active":
            out.append(f"{where}: gen {s['gen']} is left to a fenced broker to seal")
    for prev, nxt in zip(segs, segs[1:]):
        if nxt["logic_start"] is not None and (prev["state"] != "sealed" or nxt["logic_start"] != prev["logic_end"]):
            # DESIGN.md 5: a queue's logic offsets go on exactly where the sealed segment ended
            out.append(f"{where}: gen {nxt['gen']} starts at {nxt['logic_start']} where gen {prev['gen']} "
                       f"({prev['state']}) ends at {prev['logic_end']}")
    if any(s["state"] != "sealed" for s in segs[:-2]):
        out.append(f"{where}: a segment older than the last two is not sealed")
    head = segs[-1]
    if head["state"] != "active":
        out.append(f"{where}: the head gen {head['gen']} is {head['state']}")
    if head["logic_start"] is None:
        if len(segs) < 2 or segs[-2]["state"] != "sealing":
            out.append(f"{where}: a head with no start whose predecessor is not being sealed")
    elif len(segs) >= 2 and segs[-2]["state"] != "sealed":
        out.append(f"{where}: a head with a start whose predecessor is {segs[-2]['state']}")
    writable = [s for s in segs if s["state"] == "active" and s["logic_start"] is not None]
    if len(writable) > 1:
        out.append(f"{where} has {len(writable)} writable segments")


def _copies(where: str, seg: dict[str, Any], out: list[str]) -> None:
    if seg["replicas"][0] != seg["broker"]:
        out.append(f"{where}: its replicas {seg['replicas']} do not list its leader {seg['broker']} first")
    if not set(seg["in_sync"]) <= set(seg["replicas"]):
        out.append(f"{where}: in sync {seg['in_sync']} but not a replica")
    if len(set(seg["replicas"])) != len(seg["replicas"]):
        out.append(f"{where}: a broker holds two copies: {seg['replicas']}")
