"""Checks over a recorded history (history.Op lists). Pure functions: each returns a list of violations, each
``{"check", "message", "evidence"}``; an empty list means the property held.

- ``cas_register``: the topic-config register is linearizable (Wing & Gong search with memoisation, as Porcupine).
- ``monotonic_versions``: the topic version each client sees never goes back.
- ``no_lost_sends``: every message of every acknowledged batch is in the final read, at its offset, with its body.
- ``queues_contiguous``: each segment's offsets run from its start without a gap, a jump between segments is at most
  one offset budget, and no message is stored twice.
- ``one_leader_per_epoch``: no two brokers acknowledged sends in one leader epoch of a queue, by the epoch each send
  was routed with and by the epoch the log's final chain puts its offsets in (whose leader the log names).
- ``committed_offsets``: a read of a committed offset never sees one older than a commit acknowledged before it.
- ``exclusive_commits``: per queue, once a commit with token T was accepted, no commit with a smaller token is
  accepted afterwards (two owners never both commit).
- ``pops_acked_or_redelivered``: every delivery of a popped message was acked, delivered again, or dead-lettered;
  every acknowledged send to the pop topic was delivered at least once.
- ``sized_registers``: per sized topic (workloads.sizes), every read names the last write acknowledged before it or
  a write in doubt invoked after that one, with that write's exact bytes: no acknowledged write lost, none torn.
- ``answered_in_budget``: no sized write is answered later than the meta service's own deadline allows.
- ``replicas_agree``: the meta replicas' images are the same bytes at the same version after the final heal.
- ``histories_agree``: and every replica serves the same history of events through that version.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from . import bodies
from .history import FAIL, OK, UNKNOWN, Op

SEARCH_STATES_MAX = 2_000_000    # the linearizability search's bound; beyond it the answer is "inconclusive"
EVIDENCE_OPS_MAX = 6


def violation(check: str, message: str, **evidence: Any) -> dict[str, Any]:
    return {"check": check, "message": message, "evidence": evidence}


def _brief(op: Op) -> dict[str, Any]:
    return {"process": op.process, "kind": op.kind, "input": op.input, "output": op.output, "outcome": op.outcome,
            "invoke": round(op.invoke, 4), "complete": None if math.isinf(op.complete) else round(op.complete, 4)}


# -- the compare-and-set register ----------------------------------------------------------------------------------
def cas_register(ops: Iterable[Op], initial: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Linearizability of ``read`` (ok: output.value) and ``cas`` (input.from -> input.to) operations.

    Every written value is unique, so an unknown cas whose value nobody ever observed can be left out: had it taken
    effect, every later write (all are compare-and-sets) or read would have observed it. Failed operations change
    nothing and are left out too. Returns (violations, stats)."""
    ops = [o for o in ops if o.kind in ("read", "cas")]
    observed = {o.output.get("value") for o in ops if o.kind == "read" and o.outcome == OK}
    observed |= {o.input["from"] for o in ops if o.kind == "cas" and o.outcome == OK}
    entries = []
    for o in ops:
        if o.outcome == FAIL or (o.kind == "read" and o.outcome != OK):
            continue
        if o.kind == "cas" and o.outcome == UNKNOWN and o.input["to"] not in observed:
            continue
        entries.append(o)
    entries.sort(key=lambda o: o.invoke)
    result = _linearize(entries, initial)
    stats = {"register_ops": len(entries), "search_states": result["states"], "inconclusive": result["inconclusive"]}
    if result["ok"] or result["inconclusive"]:
        return [], stats
    stuck = result["stuck_at"]
    window = [_brief(o) for o in entries[stuck:stuck + EVIDENCE_OPS_MAX]]
    return [violation("cas_register", "the compare-and-set register's history is not linearizable: no order of "
                      "the operations below explains what was observed", value_before=result["stuck_state"],
                      ops=window)], stats


def _step(o: Op, state: str) -> str | None:
    """The state after ``o`` applied to ``state``, or None when ``o`` cannot happen in it."""
    if o.kind == "read":
        return state if o.output.get("value") == state else None
    return o.input["to"] if o.input["from"] == state else None


def _linearize(entries: list[Op], initial: str) -> dict[str, Any]:
    """Depth-first search over (set of linearized ops, state), memoised. An op may be linearized next when it was
    invoked before every not-yet-linearized op completed. Succeeds once every op that completed is linearized
    (unknown ones may stay out: they never took effect)."""
    n = len(entries)
    must = sum(1 << i for i, o in enumerate(entries) if not math.isinf(o.complete))
    seen: set[tuple[int, str]] = set()
    stack: list[tuple[int, str]] = [(0, initial)]
    deepest = (-1, 0, initial)   # (count linearized, first unlinearized index, state) for the evidence
    states = 0
    while stack:
        done, state = stack.pop()
        if done & must == must:
            return {"ok": True, "inconclusive": False, "states": states}
        if (done, state) in seen:
            continue
        seen.add((done, state))
        states += 1
        if states > SEARCH_STATES_MAX:
            return {"ok": False, "inconclusive": True, "states": states}
        first = 0
        while done >> first & 1:
            first += 1
        count = bin(done).count("1")
        if count > deepest[0]:
            deepest = (count, first, state)
        horizon = math.inf
        i = first
        while i < n and entries[i].invoke < horizon:
            if not done >> i & 1:
                o = entries[i]
                horizon = min(horizon, o.complete)
                after = _step(o, state)
                if after is not None:
                    stack.append((done | 1 << i, after))
            i += 1
    return {"ok": False, "inconclusive": False, "states": states, "stuck_at": deepest[1], "stuck_state": deepest[2]}


# -- versions a client sees ------------------------------------------------------------------------------------------
def monotonic_versions(ops: Iterable[Op]) -> list[dict[str, Any]]:
    """Per client, in invocation order (a client has one operation at a time), the topic ``version`` of every ok
    answer never goes back."""
    last: dict[str, Op] = {}
    out = []
    for o in sorted(ops, key=lambda o: o.invoke):
        v = o.output.get("version") if o.outcome == OK else None
        if not isinstance(v, int):
            continue
        prev = last.get(o.process)
        if prev is not None and v < prev.output["version"]:
            out.append(violation("monotonic_versions", f"{o.process} saw version {v} after {prev.output['version']}",
                                 earlier=_brief(prev), later=_brief(o)))
        if prev is None or v >= prev.output["version"]:
            last[o.process] = o
    return out


# -- acknowledged messages -------------------------------------------------------------------------------------------
def sent_messages(o: Op) -> list[tuple[int, str, str | None]]:
    """An acknowledged batch's messages: (offset, tag, the fingerprint of the body it sent) each."""
    tag = o.input["tag"]
    return [(offset, f"{tag}.{i}", bodies.fingerprint(bodies.body(f"{tag}.{i}", size)))
            for i, (offset, size) in enumerate(zip(o.output["offsets"], o.input["sizes"]))]


SEND_KINDS = ("send", "ksend")   # raw batches to a queue, keyed batches through the client library


def no_lost_sends(ops: Iterable[Op], final: Mapping[tuple[str, int], Mapping[int, str | None]]
                  ) -> list[dict[str, Any]]:
    """``final[(topic, queue)]`` maps each offset read back at the end to its body's fingerprint (bodies.py): every
    message of every acknowledged batch is there, at its offset, with its bytes."""
    out = []
    for o in ops:
        if o.kind not in SEND_KINDS or o.outcome != OK:
            continue
        topic, queue = o.input["topic"], o.output["queue"]
        if len(o.output["offsets"]) != len(o.input["sizes"]):
            out.append(violation("no_lost_sends", f"a batch of {len(o.input['sizes'])} to {topic}/{queue} was "
                                 f"answered with {len(o.output['offsets'])} offsets", op=_brief(o)))
            continue
        for offset, tag, expected in sent_messages(o):
            got = final.get((topic, queue), {}).get(offset, _MISSING)
            if got != expected:
                what = "missing" if got is _MISSING else f"holds {str(got)[:80]!r}"
                out.append(violation("no_lost_sends", f"acknowledged message {tag!r} at {topic}/{queue}@{offset} is "
                                     f"{what} in the final read", op=_brief(o)))
                if len(out) >= EVIDENCE_OPS_MAX * 10:
                    return out
    return out


_MISSING = object()


def fenced_brokers_refuse(ops: Iterable[Op], fenced: Mapping[str, list[tuple[float, float]]],
                          wall_ms: Callable[[float], float]) -> list[dict[str, Any]]:
    """A broker whose session meta fenced acknowledges no send until it is registered or unfenced again (it stops
    writing once its session lapses by its own clock, before meta can fence it: DESIGN.md invariant 4).
    ``fenced[broker]``: [(fenced_ms, back_ms)] from the log's BrokerFenced and the next BrokerRegistered or
    BrokerUnfenced (math.inf when none), stamped by meta's leader; ``wall_ms``: an op's time on that clock. A send
    (routed to that broker, acknowledged) sent after the fence and answered before the return is a violation."""
    out = []
    for o in ops:
        if o.kind != "send" or o.outcome != OK or o.input.get("broker") not in fenced:
            continue
        sent, answered = wall_ms(o.invoke), wall_ms(o.complete)
        for start, end in fenced[o.input["broker"]]:
            if start < sent and answered < end:
                out.append(violation("fenced_brokers_refuse", f"{o.input['broker']} acknowledged a send to "
                                     f"{o.input['topic']}/{o.output['queue']} {sent - start:.0f} ms after meta "
                                     "had fenced its session", op=_brief(o)))
                break
    return out


def one_leader_per_epoch(ops: Iterable[Op], epochs: Mapping[tuple[str, int], list[Mapping[str, Any]]]
                         ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """A queue's leader epoch (its head's gen: a new leader always starts a new one) has one leader: no two brokers
    acknowledge sends in one epoch. Acknowledged ``send`` ops carry (input) the ``broker`` they were sent to (the
    broker at that address answered: another refuses) and the ``leader_epoch`` of the route they were sent with;
    ``epochs[(topic, queue)]``: the queue's segments at the end, each ``{"gen", "broker", "logic_start",
    "logic_end"}`` (``logic_end`` None for the head), as the log has them.

    Each send is counted twice. By its route's epoch: two brokers answering sends routed with one epoch means meta's
    routes named two leaders for it. By the epoch its offsets lie in, in the final chain: the log names that
    segment's leader, so a send answered by another broker (a leader cut off from meta and its followers that went
    on acknowledging, over offsets the log then gave the next leader) makes two. A send whose first offset lies in
    no segment is left to no_lost_sends and queues_contiguous. Sends recorded without a broker are not counted.
    Returns (violations, stats)."""
    by_route: dict[tuple[str, int, int], dict[str, list[Op]]] = defaultdict(lambda: defaultdict(list))
    by_log: dict[tuple[str, int, int], dict[str, list[Op]]] = defaultdict(lambda: defaultdict(list))
    log_segment: dict[tuple[str, int, int], Mapping[str, Any]] = {}
    stats = {"epoch_sends_checked": 0, "epoch_sends_unplaced": 0, "epochs_acked": 0, "epochs_of_route_acked": 0}
    for o in ops:
        if o.kind != "send" or o.outcome != OK or o.input.get("broker") is None or not o.output.get("offsets"):
            continue
        topic, queue, broker = o.input["topic"], o.output["queue"], o.input["broker"]
        stats["epoch_sends_checked"] += 1
        if o.input.get("leader_epoch") is not None:
            by_route[(topic, queue, o.input["leader_epoch"])][broker].append(o)
        first = o.output["offsets"][0]
        seg = next((s for s in epochs.get((topic, queue), [])
                    if s["logic_start"] is not None and s["logic_start"] <= first
                    and (s["logic_end"] is None or first < s["logic_end"])), None)
        if seg is None:
            stats["epoch_sends_unplaced"] += 1
            continue
        key = (topic, queue, seg["gen"])
        log_segment[key] = seg
        by_log[key][broker].append(o)
    stats["epochs_acked"], stats["epochs_of_route_acked"] = len(by_log), len(by_route)
    out = []
    for (topic, queue, gen), answered in sorted(by_route.items()):
        if len(answered) > 1:
            out.append(violation("one_leader_per_epoch", f"{topic}/{queue}: sends routed with leader epoch {gen} were "
                                 f"acknowledged by {len(answered)} brokers ({', '.join(sorted(answered))}): meta's "
                                 "routes named two leaders for one epoch",
                                 sends={b: [_brief(o) for o in sent[:2]] for b, sent in sorted(answered.items())}))
    for key, answered in sorted(by_log.items()):
        topic, queue, gen = key
        seg = log_segment[key]
        if len(set(answered) | {seg["broker"]}) > 1:
            out.append(violation("one_leader_per_epoch", f"{topic}/{queue}: in leader epoch {gen}, which the log gives "
                                 f"to {seg['broker']}, sends were acknowledged by {', '.join(sorted(answered))}: "
                                 "two leaders acknowledged in one epoch",
                                 segment={k: seg.get(k) for k in ("gen", "broker", "logic_start", "logic_end",
                                                                  "sealer")},
                                 sends={b: [_brief(o) for o in sent[:2]] for b, sent in sorted(answered.items())}))
    return out, stats


def queues_contiguous(final: Mapping[tuple[str, int], Mapping[int, str | None]],
                      segments: Mapping[tuple[str, int], list[tuple[int, int | None]]],
                      budget: int, epochs: Mapping[tuple[str, int], list[Mapping[str, Any]]] | None = None,
                      retrying: tuple[str, ...] = ()) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Each queue's offsets read back fill every segment from its logic start without a gap (nothing is retained
    away in a run); between two segments the offsets may jump, by at most one offset budget, where a seal could not
    learn its broker's exact end (DESIGN.md, invariant 5). No tagged body appears twice in a topic: a send is a single
    attempt, so a second copy is the system's. Except for the processes named in ``retrying`` (prefixes of their
    tags: the keyed producers of the client library, which retries): an attempt of unknown outcome resent after a
    growth moved its key goes to the key's new queue, so a second copy in another queue is the at-least-once the
    library allows (counted, ``resent_to_a_new_queue``); in the same queue its idempotent producer must keep one. ``segments[(topic, queue)]``: (logic_start, logic_end or None
    for the head) of each segment, in order. ``epochs`` (as one_leader_per_epoch takes them, aligned with
    ``segments``), when given, say where each segment's budget ended (``budget_logic_end``): a jump is then allowed
    only to that point, since every other seal is at the end of a copy (its leader's, or after a failover the
    elected replica's) and a segment read back short of it lost records it held."""
    out = []
    jumps = resent = 0
    seen: dict[tuple[str, str], tuple[int, int]] = {}
    for (topic, queue), got in sorted(final.items()):
        offsets = sorted(got)
        chain = segments.get((topic, queue), [])
        budget_ends = [e.get("budget_logic_end") for e in (epochs or {}).get((topic, queue), [])]
        if len(budget_ends) != len(chain):
            budget_ends = [None] * len(chain)
        placed = 0
        for (start, end), budget_end in zip(chain, budget_ends):
            inside = [o for o in offsets if o >= start and (end is None or o < end)]
            placed += len(inside)
            if inside != list(range(start, start + len(inside))):
                first_gap = next((start + i for i, o in enumerate(inside) if o != start + i), None)
                out.append(violation("queues_contiguous", f"{topic}/{queue}: the segment from {start} holds offsets "
                                     f"with a gap (first missing: {first_gap}, {len(inside)} read)"))
            if end is not None and end > start + len(inside):
                if budget_end is not None and end != budget_end:
                    out.append(violation("queues_contiguous", f"{topic}/{queue}: the segment from {start} was sealed "
                                         f"at {end}, the end of a copy (its budget ends at {budget_end}), but only "
                                         f"{len(inside)} offsets from its start were read back: the rest are lost or "
                                         f"unreadable (first missing: {start + len(inside)})"))
                    continue
                jumps += 1
                if end - (start + len(inside)) > budget:
                    out.append(violation("queues_contiguous", f"{topic}/{queue}: the segment from {start} ends at "
                                         f"{end}, {end - start - len(inside)} offsets after its last message: more "
                                         f"than one offset budget ({budget})"))
        if placed != len(offsets):
            out.append(violation("queues_contiguous", f"{topic}/{queue}: {len(offsets) - placed} offsets read back "
                                 f"lie in no segment of the queue ({chain})"))
        for offset in offsets:
            tag = bodies.tag_of(got[offset])
            if tag is None:
                continue
            if (topic, tag) not in seen:
                seen[(topic, tag)] = (queue, offset)
            elif seen[(topic, tag)][0] != queue and tag.startswith(retrying):
                resent += 1
            else:
                out.append(violation("queues_contiguous", f"{topic}: message {tag!r} is stored twice, at "
                                     f"{seen[(topic, tag)]} and {(queue, offset)}"))
    return out, {"segments_read": sum(len(c) for c in segments.values()), "budget_jumps": jumps,
                 "resent_to_a_new_queue": resent}


# -- committed offsets -----------------------------------------------------------------------------------------------
def committed_offsets(ops: Iterable[Op]) -> list[dict[str, Any]]:
    """A read of a queue's committed offset (``oread``, ok) sees a commit that may be the last to take effect before
    it: one invoked before the read ended and not wholly before another commit acknowledged before the read began
    (of two overlapping commits, either may take effect last: the chaos runner, seed 7, two owners' commits
    acknowledged 2 ms apart after overlapping for two seconds), whatever broker answers it and whatever path the
    queue took between brokers. A commit refused (stale token) changes nothing."""
    by_queue: dict[Any, list[Op]] = defaultdict(list)
    for o in ops:
        if o.kind in ("commit", "oread") and o.outcome in (OK, UNKNOWN):
            by_queue[(o.input["topic"], o.input["queue"])].append(o)
    out = []
    for queue, qops in sorted(by_queue.items()):
        commits = [o for o in qops if o.kind == "commit"]
        for r in (o for o in qops if o.kind == "oread" and o.outcome == OK):
            before = [c for c in commits if c.outcome == OK and c.complete < r.invoke]
            if not before:
                continue
            last = max(before, key=lambda c: c.complete)
            horizon = max(c.invoke for c in before)   # a commit that ended before this began was overwritten
            allowed = {c.input["offset"] for c in commits if c.invoke < r.complete and c.complete >= horizon}
            if r.output["offset"] not in allowed:
                out.append(violation("committed_offsets", f"{queue[0]}/{queue[1]}: a read of the committed offset "
                                     f"answered {r.output['offset']}, but {last.input['offset']} was committed and "
                                     f"acknowledged before the read began", read=_brief(r), commit=_brief(last)))
    return out


# -- exclusive consumers' commits ------------------------------------------------------------------------------------
def exclusive_commits(ops: Iterable[Op]) -> list[dict[str, Any]]:
    """A commit B accepted after a commit A completed (A.complete < B.invoke) on the same queue must not carry a
    smaller token than A: the broker must have refused it (409 STALE_TOKEN)."""
    by_queue: dict[Any, list[Op]] = defaultdict(list)
    for o in ops:
        if o.kind == "commit" and o.outcome == OK:
            by_queue[(o.input["topic"], o.input["queue"])].append(o)
    out = []
    for queue, commits in sorted(by_queue.items()):
        by_complete = sorted(commits, key=lambda o: o.complete)
        best: Op | None = None
        j = 0
        for b in sorted(commits, key=lambda o: o.invoke):
            while j < len(by_complete) and by_complete[j].complete < b.invoke:
                a = by_complete[j]
                if best is None or a.input["token"] > best.input["token"]:
                    best = a
                j += 1
            if best is not None and b.input["token"] < best.input["token"]:
                out.append(violation("exclusive_commits", f"queue {queue[0]}/{queue[1]}: a commit with token "
                                     f"{b.input['token']} was accepted after one with token {best.input['token']}",
                                     newer_owner=_brief(best), stale_owner=_brief(b)))
    return out


# -- pops ------------------------------------------------------------------------------------------------------------
def _first_ok_acks(ops: Iterable[Op]) -> dict[str, Op]:
    """Each handle the broker answered ok for, with the first ack (by completion) that got that answer."""
    first: dict[str, Op] = {}
    for o in ops:
        if o.kind == "ack" and o.outcome == OK:
            for r in o.output.get("results", []):
                if r.get("ok") and (r["handle"] not in first or o.complete < first[r["handle"]].complete):
                    first[r["handle"]] = o
    return first


def pops_acked_or_redelivered(ops: Iterable[Op], dead_lettered: set[tuple[str, int, int]],
                              pop_topic: str) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """``pop`` ops (ok) output ``messages``: [{"queue","offset","handle"}]; ``ack`` ops input ``handles`` and, when
    ok, output ``results``: [{"handle","ok"}]. An ack of unknown outcome counts as possibly acked.
    ``dead_lettered``: (topic, queue, origin offset) found in the group's dead-letter queues at the end."""
    ops = list(ops)
    acked = set(_first_ok_acks(ops))   # the broker answered ok, or (below) the ack's outcome is unknown
    for o in ops:
        if o.kind == "ack" and o.outcome == UNKNOWN:
            acked |= set(o.input["handles"])
    deliveries: dict[tuple[int, int], list[tuple[Op, dict[str, Any]]]] = defaultdict(list)
    for o in ops:
        if o.kind == "pop" and o.outcome == OK:
            for m in o.output.get("messages", []):
                deliveries[(m["queue"], m["offset"])].append((o, m))
    out = []
    for (queue, offset), ds in sorted(deliveries.items()):
        ds.sort(key=lambda d: d[0].complete)
        for k, (o, m) in enumerate(ds):
            if m["handle"] in acked:
                continue
            if k + 1 == len(ds) and (pop_topic, queue, offset) not in dead_lettered:
                out.append(violation("pops_acked_or_redelivered", f"{pop_topic}/{queue}@{offset} was popped and "
                                     "neither acked, nor delivered again, nor dead-lettered",
                                     **_delivery_story(ops, ds)))
    for o in ops:
        if o.kind == "send" and o.outcome == OK and o.input["topic"] == pop_topic:
            for offset, tag, _ in sent_messages(o):
                key = (o.output["queue"], offset)
                if key not in deliveries and (pop_topic, *key) not in dead_lettered:
                    out.append(violation("pops_acked_or_redelivered", f"acknowledged message {tag!r} at "
                                         f"{pop_topic}/{key[0]}@{key[1]} was never popped", send=_brief(o)))
    return out, {"deliveries": sum(len(d) for d in deliveries.values())}


def _delivery_story(ops: list[Op], deliveries: list[tuple[Op, dict[str, Any]]]) -> dict[str, Any]:
    """One message's every delivery (its pop, compactly) and every ack that named one of its handles, with that
    handle's result: the evidence a pop violation needs (a pop of eight messages said little of the one)."""
    handles = {m["handle"] for _, m in deliveries}

    def when(o: Op) -> dict[str, Any]:
        return {"process": o.process, "address": o.input.get("address"), "outcome": o.outcome,
                "invoke": round(o.invoke, 4), "complete": None if math.isinf(o.complete) else round(o.complete, 4)}
    acks = []
    for o in ops:
        named = handles & set(o.input.get("handles") or ()) if o.kind == "ack" else set()
        if named:
            results = {r["handle"]: r["ok"] for r in (o.output or {}).get("results", [])}
            acks.append({**when(o), "handles": {h: results.get(h) for h in sorted(named)}})
    return {"deliveries": [{**when(o), "handle": m["handle"], "attempt": m.get("attempt")} for o, m in deliveries],
            "acks": acks}


def acked_pops_stay_acked(ops: Iterable[Op]) -> list[dict[str, Any]]:
    """An ack the broker answered ok is final: no pop invoked after it completed delivers that message again, from
    any broker, whatever failed meanwhile (the promise of issue 37: a failover neither loses an ack nor brings an
    acknowledged pop back). A pop under way while the ack was is not judged (the message may have come due first),
    nor is a redelivery after an ack of unknown outcome. A late ack through a superseded handle answered ok once the
    newer delivery's own ack had been (stale_pop_acks) is judged from its own completion like any other."""
    ops = list(ops)
    confirmed = _first_ok_acks(ops)
    deliveries: dict[tuple[int, int], list[tuple[Op, str]]] = defaultdict(list)
    for o in ops:
        if o.kind == "pop" and o.outcome == OK:
            for m in o.output.get("messages", []):
                deliveries[(m["queue"], m["offset"])].append((o, m["handle"]))
    out = []
    for (queue, offset), ds in sorted(deliveries.items()):
        acks = [(confirmed[h], p) for p, h in ds if h in confirmed]
        if not acks:
            continue
        ack, acked_pop = min(acks, key=lambda a: a[0].complete)
        again = [p for p, _ in ds if p.invoke > ack.complete]
        if again:
            first = min(again, key=lambda p: p.invoke)
            out.append(violation("acked_pops_stay_acked", f"queue {queue}@{offset}: delivered again "
                                 f"{first.invoke - ack.complete:.3f} s after an ack the broker answered ok",
                                 acked_delivery=_brief(acked_pop), ack=_brief(ack), next_delivery=_brief(first)))
    return out


def stale_pop_acks(ops: Iterable[Op]) -> list[dict[str, Any]]:
    """An ack through a superseded handle changes nothing: a broker that had already delivered the message again
    under a newer handle (a pop from the same address, invoked after the first pop completed and completed before
    the ack was invoked) must not answer the old handle's ack ok, or the newer delivery's consumer loses the
    message it holds. (Another broker, after a failover, knows nothing of the newer delivery: not judged here.)
    Once any delivery's ack was answered ok, the message is done, and an ok to the old handle changes nothing: a
    broker restarted since has no memory of which delivery was acked (PopService._verdict, DONE). Any, not only the
    newer one's: a restart loses first deliveries not yet written (state.py), so the message may come a third time
    and be acked through that handle while the second is still out."""
    ops = list(ops)
    delivered: dict[str, tuple[Op, tuple[int, int]]] = {}           # handle -> its pop, (queue, offset)
    by_message: dict[tuple[str, int, int], list[tuple[Op, str]]] = defaultdict(list)   # (address, q, off) -> pops
    acked_at = {h: a.complete for h, a in _first_ok_acks(ops).items()}   # handle -> when its first ok ack ended
    for o in ops:
        if o.kind == "pop" and o.outcome == OK:
            for m in o.output.get("messages", []):
                delivered[m["handle"]] = (o, (m["queue"], m["offset"]))
                by_message[(o.input["address"], m["queue"], m["offset"])].append((o, m["handle"]))
    done_at = {message: min((acked_at.get(h, math.inf) for _, h in pops), default=math.inf)
               for message, pops in by_message.items()}   # when the message's first ok ack ended
    out = []
    for a in ops:
        if a.kind != "ack" or a.outcome != OK:
            continue
        for r in a.output.get("results", []):
            if not r.get("ok") or r["handle"] not in delivered:
                continue
            first, (queue, offset) = delivered[r["handle"]]
            message = (a.input["address"], queue, offset)
            if done_at.get(message, math.inf) < a.invoke:
                continue
            newer = [(p, h) for p, h in by_message[message]
                     if h != r["handle"] and p.invoke > first.complete and p.complete < a.invoke]
            if newer:
                out.append(violation("stale_pop_acks", f"queue {queue}@{offset}: an ack through a handle the broker "
                                     "had superseded by delivering the message again was answered ok",
                                     ack=_brief(a), first_pop=_brief(first), newer_pop=_brief(newer[0][0])))
    return out


def keys_in_order(ops: Iterable[Op], barriers: Mapping[tuple[str, int], list[tuple[int, int]]]
                  ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Keys keep their order (DESIGN.md invariant 7) as the client library routes them. ``ksend`` ops (ok) of one
    process and one key, each invoked after the one before completed: the later batch lies after the earlier one
    in its queue, or, when a growth moved the key's slot to another queue, behind barriers leading back to the
    earlier batch's queue past its offsets (an exclusive group then reads it only after the earlier one).
    ``barriers[(topic, queue)]``: [(after_queue, after_offset)] from the route. Stats: the pairs checked, and those
    whose key had moved to another queue between the two."""
    out, pairs, moved = [], 0, 0
    last: dict[tuple[str, str, str], Op] = {}   # (process, topic, key) -> its last acknowledged batch
    for o in sorted((o for o in ops if o.kind == "ksend" and o.outcome == OK), key=lambda o: o.invoke):
        k = (o.process, o.input["topic"], o.input["key"])
        before = last.get(k)
        last[k] = o
        if before is None or before.complete > o.invoke:
            continue
        topic, q1, q2 = o.input["topic"], before.output["queue"], o.output["queue"]
        end = max(before.output["offsets"]) + 1
        pairs += 1
        moved += q1 != q2
        if q1 == q2:
            ok = min(o.output["offsets"]) >= end
        else:
            ok = _behind(barriers, topic, q2, q1, end)
        if not ok:
            out.append(violation("keys_in_order", f"key {o.input['key']!r} of {topic}: a batch acknowledged at "
                                 f"{q2}@{min(o.output['offsets'])} could be read before the one acknowledged "
                                 f"before it at {q1}@{end - 1}", earlier=_brief(before), later=_brief(o)))
    return out, {"key_pairs": pairs, "key_pairs_moved": moved}


def _behind(barriers: Mapping[tuple[str, int], list[tuple[int, int]]], topic: str, queue: int, earlier: int,
            end: int) -> bool:
    """Whether ``queue``'s messages wait, through barriers, for ``earlier`` to be consumed up to at least ``end``."""
    seen, todo = set(), [queue]
    while todo:
        q = todo.pop()
        if q in seen:
            continue
        seen.add(q)
        for after_queue, after_offset in barriers.get((topic, q), []):
            if after_queue == earlier and after_offset >= end:
                return True
            todo.append(after_queue)
    return False


# A lease may end up to about raft_tuning.leader_fallback_timeout_s (0.5 s) later by the member's clock than a new
# meta leader counts it (a deposed leader renewing from its stale image: meta/group_sessions.py), and clients keep a
# second's margin for it: a grant is early only by more than this.
LEASE_MARGIN_MS = 1000


def leases_never_overlap(ops: Iterable[Op]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """A queue's lease is never granted before the lease promised to its previous holder ends, even after an
    operator shortened ``lease_ms``. ``heartbeat`` ops (ok) output ``answered_wall_ms`` and ``assignments``:
    [[queue, token, lease_expires_ms]]. Per queue, in token order: the first answer that gave a token must come no
    earlier than LEASE_MARGIN_MS before the latest lease end any answer promised for a lower token. A holder that
    gives a queue back ends its lease then: a heartbeat's (or a leave's) input may name ``released``
    [[queue, token]] and ``sent_wall_ms`` (any outcome: a release the member sent may have been applied). Stats:
    the grants that followed another on their queue (``lease_handovers``), and those of them whose previous token its
    holder had given back (``lease_handovers_released``: the lease ended at the release, not at its expiry)."""
    promised: dict[tuple[int, int], tuple[int, Op]] = {}
    granted: dict[tuple[int, int], tuple[int, Op]] = {}
    released: dict[tuple[int, int], int] = {}
    for o in ops:
        if o.kind not in ("heartbeat", "leave"):
            continue
        for queue, token in o.input.get("released", ()):
            key = (queue, token)
            released[key] = min(released.get(key, o.input["sent_wall_ms"]), o.input["sent_wall_ms"])
        if o.kind != "heartbeat" or o.outcome != OK:
            continue
        at = o.output["answered_wall_ms"]
        for queue, token, end in o.output["assignments"]:
            key = (queue, token)
            if key not in promised or end > promised[key][0]:
                promised[key] = (end, o)
            if key not in granted or at < granted[key][0]:
                granted[key] = (at, o)
    out, handovers, after_release = [], 0, 0
    for queue in sorted({q for q, _ in granted}):
        before: tuple[int, int, Op] | None = None   # (latest lease end promised for a lower token, the token, the answer)
        previous: int | None = None
        for token in sorted(t for q, t in granted if q == queue):
            at, o = granted[(queue, token)]
            handovers += before is not None
            after_release += (queue, previous) in released
            previous = token
            if before is not None and at < before[0] - LEASE_MARGIN_MS:
                out.append(violation("leases_never_overlap", f"queue {queue}: token {token} was granted "
                                     f"{before[0] - at} ms before the lease promised with token {before[1]} ended",
                                     grant=_brief(o), promise=_brief(before[2])))
            end, promise = promised[(queue, token)]
            end = min(end, released.get((queue, token), end))
            if before is None or end > before[0]:
                before = (end, token, promise)
    return out, {"lease_handovers": handovers, "lease_handovers_released": after_release}


# The operator's remap, grow and lease operations are recorded (and counted in the summary's operator_changes) but
# no check reads them: they are not counted here.
CHECKED_KINDS = frozenset({"cas", "read", "read_mv", "send", "ksend", "commit", "oread", "pop", "ack", "put",
                           "sread", "heartbeat"})


def count_checked(ops: Iterable[Op]) -> int:
    """Operations the checks above look at: those of the kinds they read, with an outcome that can say something
    (ok or unknown; a definite failure is checked too where it matters, as a commit refused for its token)."""
    return sum(1 for o in ops if o.kind in CHECKED_KINDS and o.outcome in (OK, UNKNOWN))


# -- sized writes ----------------------------------------------------------------------------------------------------
def sized_registers(ops: Iterable[Op]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``put`` ops (input: topic, value, digest, bytes, stale; a retry with the same Idempotency-Key repeats the
    value) and ``sread`` ops (ok: output value, digest). Each topic has one writer at a time (the runner's probe after
    the workload's), one write at a time, each write with ``expected_version``: so writes take effect in invocation order, and a write in doubt cannot take effect
    after a later acknowledged one (its expected version is gone by then). A read R must therefore see the last
    write acknowledged before R began (A), or a write not refused that was invoked after A and before R ended, and
    the bytes that write sent; before any acknowledged write, the topic's empty config (value None) is allowed too.
    A ``stale`` write (an expected version already gone when it was sent) can never take effect: acknowledged or
    seen, it is a violation."""
    ops = list(ops)
    out: list[dict[str, Any]] = []
    stats: dict[str, Any] = {"sized_reads": 0, "sized_writes_acked": 0, "sized_bytes_acked": 0}
    for topic in sorted({o.input["topic"] for o in ops if o.kind in ("put", "sread")}):
        writes = _sized_writes([o for o in ops if o.kind == "put" and o.input["topic"] == topic])
        reads = [o for o in ops if o.kind == "sread" and o.input["topic"] == topic and o.outcome == OK]
        stats["sized_reads"] += len(reads)
        stats["sized_writes_acked"] += sum(1 for w in writes.values() if w["acked"])
        stats["sized_bytes_acked"] += sum(w["bytes"] for w in writes.values() if w["acked"])
        for w in writes.values():
            if w["stale"] and w["acked"]:
                out.append(violation("sized_registers", f"{topic}: write {w['value']!r} was acknowledged although its "
                                     "expected version was already gone", ops=[_brief(o) for o in w["ops"]]))
        for r in reads:
            problem = _sized_read_problem(r, writes)
            if problem:
                out.append(violation("sized_registers", f"{topic}: {problem}", read=_brief(r),
                                     writes=_writes_near(r, writes)))
    return out, stats


def _sized_writes(puts: list[Op]) -> dict[str, dict[str, Any]]:
    """value -> the write's attempts folded: first invocation, acknowledged (and when first), refused by all."""
    writes: dict[str, dict[str, Any]] = {}
    for o in sorted(puts, key=lambda o: o.invoke):
        w = writes.setdefault(o.input["value"], {"value": o.input["value"], "digest": o.input["digest"],
                                                 "bytes": o.input["bytes"], "invoke": o.invoke, "acked_at": math.inf,
                                                 "acked": False, "refused": True, "ops": [],
                                                 "stale": bool(o.input.get("stale"))})
        w["ops"].append(o)
        if o.outcome == OK:
            w["acked"] = True
            w["acked_at"] = min(w["acked_at"], o.complete)
        if o.outcome != FAIL and not w["stale"]:
            w["refused"] = False
    return writes


def _sized_read_problem(r: Op, writes: dict[str, dict[str, Any]]) -> str | None:
    seen, digest = r.output.get("value"), r.output.get("digest")
    before = [w for w in writes.values() if w["acked_at"] < r.invoke]
    last = max(before, key=lambda w: w["invoke"], default=None)
    floor = last["invoke"] if last else -math.inf
    allowed = {w["value"] for w in writes.values()
               if not w["refused"] and floor <= w["invoke"] < r.complete}
    if last is None:
        allowed.add(None)
    if seen not in allowed:
        if isinstance(seen, str) and seen.startswith("torn:"):
            return f"a read saw the values of several writes at once ({seen})"
        named = "the empty config" if seen is None else f"write {seen!r}"
        ack = f"write {last['value']!r} was acknowledged before it began" if last else "no write was acknowledged"
        return f"a read saw {named}, but {ack} (allowed: {sorted(map(str, allowed))[:EVIDENCE_OPS_MAX]})"
    if seen is not None and digest != writes[seen]["digest"]:
        sent = writes[seen]["digest"]
        return f"a read saw write {seen!r} with other bytes than it sent (digest {digest}, sent {sent})"
    return None


def _writes_near(r: Op, writes: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    ordered = sorted(writes.values(), key=lambda w: w["invoke"])
    before = [i for i, w in enumerate(ordered) if w["invoke"] < r.invoke]
    start = max(0, (before[-1] if before else 0) - EVIDENCE_OPS_MAX // 2)
    return [_brief(o) for w in ordered[start:start + EVIDENCE_OPS_MAX] for o in w["ops"]]


def answered_in_budget(ops: Iterable[Op], budget_s: float,
                       paused: Mapping[str, list[tuple[float, float]]]) -> list[dict[str, Any]]:
    """Every ``put`` is answered (ok or an error status) within ``budget_s``: output ``answered_s`` is the time its
    answer took, ``unanswered_s`` the client's longer timeout that passed without one. The time its node (input
    ``node``) spent stopped by the nemesis (``paused``: node -> [(from, to)] on the history's clock) does not count:
    a stopped process answers late through no fault of its own, and nothing else excuses it."""
    out = []
    for o in ops:
        if o.kind != "put":
            continue
        took = o.output.get("answered_s", o.output.get("unanswered_s"))
        if took is None:
            continue
        end = o.invoke + took
        stopped = sum(max(0.0, min(end, b) - max(o.invoke, a)) for a, b in paused.get(o.input.get("node"), []))
        if took - stopped > budget_s:
            what = "answered after" if "answered_s" in o.output else "still unanswered after"
            out.append(violation("answered_in_budget", f"a write of {o.input.get('bytes')} bytes was {what} "
                                 f"{took:.1f} s ({stopped:.1f} s of it with its node paused), past the {budget_s:g} s "
                                 "budget", op=_brief(o)))
    return out


def voters_agree(statuses: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``statuses``: node -> its /v1/cluster answer, or {"error": ...}. After the final heal every node votes (a
    wiped disk was caught up and promoted, meta/raft/membership.py) and every node names the same disk for each
    voter, its own disk for itself."""
    if any("error" in s or not s.get("voter") for s in statuses.values()):
        return [violation("voters_agree", "a meta node is not a voter after the final heal",
                          statuses={n: {k: s.get(k) for k in ("voter", "disk", "error")} for n, s in statuses.items()})]
    views = {n: {m["node"]: m["disk"] for m in s["members"]} for n, s in statuses.items()}
    if len({tuple(sorted(v.items())) for v in views.values()}) != 1 or any(
            views[n].get(n) != s["disk"] for n, s in statuses.items()):
        return [violation("voters_agree", "the meta nodes do not agree on the voters' disks", views=views,
                          disks={n: s["disk"] for n, s in statuses.items()})]
    return []


def replicas_agree(digests: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``digests``: node -> its /v1/admin/image-digest answer (version, commands, sha256), or {"error": ...} for a
    node that never reached the version the others hold. Every node must hold the same image at the same version."""
    versions = {n: d.get("version") for n, d in digests.items()}
    if len(set(versions.values())) != 1 or None in versions.values():
        return [violation("replicas_agree", "the replicas did not reach one version after the final heal",
                          digests=dict(digests))]
    if len({d["sha256"] for d in digests.values()}) != 1 or len({d["commands"] for d in digests.values()}) != 1:
        return [violation("replicas_agree", f"the replicas hold different images at version "
                          f"{next(iter(versions.values()))}", digests=dict(digests))]
    return []


def histories_agree(histories: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``histories``: node -> {version, events, sha256} of its whole /v1/history through the version the images
    agree at, or {"error": ...}. Every node must serve the same events (the images' digests could agree while the
    replicas' histories, the lineage's source, differ). Empty when the images never agreed: replicas_agree says so."""
    if not histories:
        return []
    if any("error" in h for h in histories.values()) or len({(h["events"], h["sha256"])
                                                               for h in histories.values()}) != 1:
        return [violation("histories_agree", "the meta nodes serve different histories through the version their "
                          "images agree at", histories=dict(histories))]
    return []
