"""Builders and checks for the pure state machine (meta/state_machine.py): ``Log`` feeds envelopes as the Raft adapter
would and asserts on every outcome; ``check_image_invariants`` holds any image to DESIGN.md's structural rules.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from meta import allocation, chains, invariants
from meta.image import Image
from meta.state_machine import StateMachine


BUDGET = 1000  # a small offset budget keeps the arithmetic readable
STATUS = {
    "INVALID_ARGUMENT": 400,
    "TOPIC_NOT_FOUND": 404, "BROKER_NOT_FOUND": 404, "SEGMENT_NOT_FOUND": 404,
    "TOPIC_EXISTS": 409, "VERSION_MISMATCH": 409, "NO_BROKERS": 409, "BROKER_NOT_ACTIVE": 409, "STALE_EPOCH": 409,
    "NOT_SEALING": 409, "ALREADY_SEALED": 409, "IDEMPOTENCY_KEY_REUSED": 409, "TOO_MANY_BROKERS": 409,
    "TOO_MANY_TOPICS": 409, "STALE_LEADER_EPOCH": 409, "NOT_ENOUGH_BROKERS": 409, "OUT_OF_SCOPE": 409,
    "GROUP_MODE_MISMATCH": 409,
    "SEALING": 503,
}


# The state machine turns an unexpected exception in a decision into this INVALID_ARGUMENT message. It is a safety net
# for bugs, so a test that sees it has found one, even when the status looks right.
CATCH_ALL = "command could not be decided"


def disk_id(n: int) -> str:
    """The ``n``-th new disk of a test: a well-formed disk id (wire/disk_identity.py), never a broker's own."""
    return f"{n:032x}"


def stable(sm: StateMachine) -> dict[str, Any]:
    """The image as data, without the keys every command touches, rejected or not: the count of applied commands,
    the leader time, and the remembered outcomes."""
    data = json.loads(sm.image.canonical_bytes())
    data.pop("commands")
    data.pop("last_ts")
    data.pop("requests")
    return data


def events_after(sm: StateMachine, version: int) -> list[dict[str, Any]]:
    return [json.loads(s) for s in sm.image.history_after(version, 10**9)]


def chains_of(t: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """A topic's segment chains as the API shows them (the image keeps them compact: meta/chains.py)."""
    return [chain for _q, chain in chains.chains(t)]


def table_of(t: dict[str, Any]) -> list[list[int]]:
    return allocation.slot_table(t["slot_table"])


def slot_owners(table: list[list[int]], slots: int) -> list[int]:
    """Asserts that the table covers [0, slots) exactly once (sorted, contiguous, non-empty); returns slot -> queue."""
    owners: list[int] = []
    lo_expected = 0
    for lo, hi, q in table:
        assert lo == lo_expected and lo < hi, f"gap, overlap or empty range at {[lo, hi, q]} in {table}"
        owners.extend([q] * (hi - lo))
        lo_expected = hi
    assert lo_expected == slots, f"slot table ends at {lo_expected}, not {slots}: {table}"
    return owners


def check_image_invariants(image: Image) -> None:
    """Structural invariants of any image (DESIGN.md 3, 5, 7): chains, heads, slot tables, load counters
    (meta/invariants.py, which the simulator holds every node's final image to as well)."""
    found = invariants.problems(image)
    assert not found, "\n".join(found)


class Log:
    """A state machine plus the envelopes fed to it, with assertions on every outcome."""

    def __init__(self, budget: int = BUDGET, sm: StateMachine | None = None):
        self.sm = sm or StateMachine()
        self.budget = budget  # the leader's grant, stamped into every envelope as the Raft adapter does
        self.history: int | None = None  # the leader's history window, stamped likewise when set
        self.envelopes: list[dict[str, Any]] = []
        self.outcomes: list[dict[str, Any]] = []
        self.ts = 1_000_000
        self.changed: set[str] = set()

    @property
    def version(self) -> int:
        return self.sm.image.version

    def send(self, cmd: Any, rid: str | None = None, ts: int | None = None) -> dict[str, Any]:
        if ts is None:
            self.ts += 10
            ts = self.ts
        env = {"rid": rid, "ts": ts, "budget": self.budget, "actor": "admin", "cmd": copy.deepcopy(cmd)}
        if self.history is not None:
            env["history"] = self.history
        self.envelopes.append(copy.deepcopy(env))
        before = self.version
        n_history = self.sm.image.data["history_start"] + len(self.sm.image.data["history"])
        retry = bool(rid) and rid in self.sm.image.data["requests"]
        outcome, self.changed = self.sm.apply(env)
        self.outcomes.append(copy.deepcopy(outcome))
        # versions grow by exactly the number of events (DESIGN.md 3); every answer carries the version
        assert self.version - before == (self.sm.image.data["history_start"] + len(self.sm.image.data["history"])
                                         - n_history)
        if retry:  # the first outcome, with the version it had then
            assert outcome["version"] <= self.version
        else:
            assert outcome["version"] == self.version
        return outcome

    def ok(self, cmd: Any, **kw: Any) -> dict[str, Any]:
        out = self.send(cmd, **kw)
        assert out["ok"] is True, out
        assert out["result"]["version"] == out["version"]
        return out["result"]

    def reject(self, cmd: Any, code: str | None = None, **kw: Any) -> dict[str, Any]:
        """The error of a command a decision refuses (``code``, when named), the image and version unchanged."""
        before, version = stable(self.sm), self.version
        out = self.send(cmd, **kw)
        assert out["ok"] is False, out
        err = out["error"]
        assert code is None or err["code"] == code, err
        assert err["status"] == STATUS[err["code"]], err
        assert isinstance(err["message"], str) and err["message"]
        assert not err["message"].startswith(CATCH_ALL), f"an exception inside apply: {err['message']}"
        assert isinstance(err["details"], dict)
        assert out["version"] == version
        assert stable(self.sm) == before, "a rejection changed the image"
        assert self.changed == set()
        return err

    # shorthands
    def register(self, broker: str, address: str | None = None, zone: str | None = None,
                 cluster: str | None = None, disk: str | None = None) -> int:
        """``disk``: a disk id (``disk_id``); none: the broker's own, the same at every registration (a restart)."""
        cmd = {"type": "RegisterBroker", "broker": broker, "address": address or f"http://{broker}:7000",
               "disk": disk or hashlib.md5(broker.encode()).hexdigest()}
        for field, value in (("zone", zone), ("cluster", cluster)):
            if value is not None:
                cmd[field] = value
        return self.ok(cmd)["epoch"]

    def epoch(self, broker: str) -> int:
        return self.sm.image.brokers[broker]["epoch"]

    def epochs(self, brokers: list[str]) -> dict[str, int]:
        """The current registration epoch of each registered one (an in-sync change names them)."""
        return {b: self.epoch(b) for b in brokers if b in self.sm.image.brokers}

    def fence(self, broker: str) -> dict[str, Any]:
        return self.ok({"type": "FenceBroker", "broker": broker, "epoch": self.epoch(broker),
                        "reason": "session_expired"})

    def create(self, topic: str, queues: int, **kw: Any) -> dict[str, Any]:
        return self.ok({"type": "CreateTopic", "topic": topic, "queues": queues, **kw})

    def topic(self, name: str) -> dict[str, Any]:
        return self.sm.image.topics[name]

    def segs(self, topic: str, queue: int) -> list[dict[str, Any]]:
        return chains_of(self.topic(topic))[queue]

    def head(self, topic: str, queue: int) -> dict[str, Any]:
        return self.segs(topic, queue)[-1]

    def seal_cmd(self, topic: str, queue: int, gen: int, end: int, broker: str | None = None,
                 epoch: int | None = None) -> dict[str, Any]:
        broker = broker or self.sm.image.segment(topic, queue, gen)["sealer"]
        return {"type": "SealSegment", "broker": broker, "epoch": epoch or self.epoch(broker), "topic": topic,
                "queue": queue, "gen": gen, "end_offset": end}

    def seal(self, topic: str, queue: int, gen: int, end: int, **kw: Any) -> dict[str, Any]:
        return self.ok(self.seal_cmd(topic, queue, gen, end, **kw))

    def remap(self, topic: str, brokers: list[str], **kw: Any) -> dict[str, Any]:
        return self.ok({"type": "RemapTopic", "topic": topic, "brokers": brokers, **kw})

    def grow(self, topic: str, queues: int, **kw: Any) -> dict[str, Any]:
        return self.ok({"type": "GrowTopic", "topic": topic, "queues": queues, **kw})

    def events(self, since: int) -> list[dict[str, Any]]:
        return events_after(self.sm, since)

    def seal_all_sealing(self, end_of: Any = lambda seg: seg["budget_end"] // 2) -> None:
        """Let every broker report the end of its sealing segments (the second half of the remap flow)."""
        for name in sorted(self.sm.image.topics):
            for q, segs in enumerate(chains_of(self.topic(name))):
                for s in segs:
                    if s["state"] == "sealing":
                        self.seal(name, q, s["gen"], end_of(s))
