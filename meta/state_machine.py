"""The pure, deterministic state machine: a command envelope in, events out, folded into the image.

``apply(envelope)`` is the only entry point the Raft adapter calls. It
1. answers a repeated request id with the first outcome (idempotency survives LEADER_CHANGED / UNKNOWN_OUTCOME retries),
2. validates (meta/commands.py) and decides against the image, producing events or a rejection (a rejection changes
   nothing): each command type's decider is in meta/deciders/, one file per domain, dispatched by ``DECIDERS``,
3. replays the events into the image, each event taking the next version,
4. remembers the outcome under the request id.
No clock, randomness or I/O: the leader's time arrives in ``envelope["ts"]``.
"""

from __future__ import annotations

import hashlib
from collections import deque
from typing import Any

from . import limits

from .raft import membership as raft_membership
from .commands import validate
from .deciders import Decider, brokers, groups, history, replicas, segments, topics
from wire import json_body
from wire.errors import ApiError, invalid, rejection
from .image import Image

Outcome = dict[str, Any]

# Which decider decides each command type: one table per domain (meta/deciders/), no two naming the same type
# (tests/test_deciders.py). commands.VALIDATORS names the same types: a type it does not know is refused as an
# unknown command before this table is read.
DECIDERS: dict[str, Decider] = {
    **brokers.DECIDERS,     # RegisterBroker, FenceBroker, UnfenceBroker, GrantOffsetBudget
    **topics.DECIDERS,      # CreateTopic, GrowTopic, SetTopicConfig, DeleteTopic, RemapTopic
    **segments.DECIDERS,    # SealSegment, SealSegments
    **replicas.DECIDERS,    # AlterInSync, ElectLeaders
    **groups.DECIDERS,      # JoinGroup, LeaveGroup, ExpireMembers, ReleaseLocks, ExpireLocks, SetGroupConfig
    **history.DECIDERS,     # Barrier
}


class StateMachine:
    def __init__(self, image: Image | None = None):
        self.image = image or Image()
        # The remembered requests' ids, oldest first, for eviction (_remember): derived from the image's
        # ``requests`` dict, never part of it, and rebuilt when the image's dict is another one (a snapshot).
        self._request_order: deque[str] = deque()
        self._request_order_of: dict[str, Any] | None = None

    # -- the entry point ---------------------------------------------------------------------------------------
    def apply_membership(self, envelope: Any) -> Outcome:
        """A membership entry (meta/raft/membership.py): the voters, recorded in the image so that snapshots carry
        them. It changes no topic and makes no event; what is not a well-formed membership changes nothing."""
        cmd = envelope.get("cmd") if isinstance(envelope, dict) else None
        members = raft_membership.parse(cmd)
        if members is None:
            return _failed(invalid("not a well-formed membership entry"), self.image.version)
        self.image.data["members"] = [m.to_json() for m in members]
        return {"ok": True, "result": {"members": self.image.data["members"]}, "version": self.image.version}

    def apply(self, envelope: Any) -> tuple[Outcome, set[str]]:
        """Returns (outcome, topics whose route changed). An outcome is {"ok", "result"|"error", "version"}.

        Total: whatever an entry holds, the answer is an outcome, the same on every replica. Only a failure while
        replaying events (a broken invariant of the image) escapes, and the Raft adapter stops the node for it.
        """
        try:
            rid, ts, budget, window, fingerprint = _check_envelope(envelope)
        except ApiError as e:  # a malformed entry changes nothing at all, not even the command count
            return _failed(e, self.image.version), set()
        # An envelope that passed the checks above changes the image (at least last_ts): count it, so replicas
        # can be compared at equal counts.
        self.image.data["commands"] += 1
        ts = max(ts, self.image.data["last_ts"])  # leader clocks may step back across elections; time in the log never does
        self.image.data["last_ts"] = ts
        if window is not None:
            history.set_window(self.image, window)
        cmd = envelope.get("cmd")
        if rid:
            seen = self.image.data["requests"].get(rid)
            if seen is not None:
                if seen[0] != fingerprint:
                    return _failed(rejection(409, "IDEMPOTENCY_KEY_REUSED",
                                             "this Idempotency-Key was used for a different request"),
                                   self.image.version), set()
                return json_body.decode(seen[2]), set()
        try:
            validate(cmd)
            events, result = DECIDERS[cmd["type"]](self.image, cmd, ts, budget)
        except ApiError as e:
            outcome = _failed(e, self.image.version)
            changed: set[str] = set()
        except Exception as e:  # a bug in a decision: nothing was changed yet, so reject (the same way on every node)
            outcome = _failed(invalid(f"command could not be decided: {type(e).__name__}"), self.image.version)
            changed = set()
        else:
            changed = set()
            for ev in events:
                changed |= self.image.replay(ev, ts)
            outcome = {"ok": True, "result": {**result, "version": self.image.version}, "version": self.image.version}
        if rid:
            self._remember(rid, fingerprint, ts, json_body.encode(outcome).decode())
        return outcome, changed

    def _remember(self, rid: str, fingerprint: str, ts: int, outcome_text: str) -> None:
        requests = self.image.data["requests"]
        if self._request_order_of is not requests:
            self._request_order, self._request_order_of = deque(requests), requests
        order = self._request_order
        # The outcome as its JSON text in a tuple of atoms, which the garbage collector stops tracking: as a list
        # holding the outcome's dicts, each write left three more objects for every collection of the older
        # generations to walk, and at 64 writers a node's young collections walked ~140,000 of them (40-66 ms, all
        # three nodes at once: the p99 of the writes). A repeat decodes its own copy.
        requests[rid] = (fingerprint, ts, outcome_text)   # a new id: a remembered one is answered before apply
        order.append(rid)
        # Dicts keep insertion order, so the oldest request is first: evict by count and by age, deterministically.
        # The oldest is taken from ``order``, not next(iter(requests)): a dict's iteration starts by stepping over
        # the slots its deletions left until the next resize, so at the cap each apply stepped over tens of
        # thousands (ops/bench/apply.py past 100,000 commands: 15 -> 26 -> 39 us a command, and climbing).
        while order:
            oldest = order[0]
            if len(requests) > limits.REQUEST_OUTCOMES_MAX or ts - requests[oldest][1] > limits.REQUEST_OUTCOME_AGE_MS_MAX:
                del requests[oldest]
                order.popleft()
            else:
                break


def _check_envelope(envelope: Any) -> tuple[str | None, int, int, int | None, str | None]:
    """(rid, ts, budget, history window or None, fingerprint) of a well-formed envelope; anything else is a
    rejection that changes nothing.

    What an outside caller controls reaches apply inside the command: its text must encode (no lone surrogates), its
    nesting must be shallow, its size bounded. One encode of the canonical text checks the first two in C.
    """
    if not isinstance(envelope, dict):
        raise invalid("a command envelope must be an object")
    rid, ts, budget = envelope.get("rid"), envelope.get("ts"), envelope.get("budget", limits.OFFSET_BUDGET_DEFAULT)
    if isinstance(ts, bool) or not isinstance(ts, int) or not 0 <= ts <= 2**62:
        raise invalid("command envelope without a leader timestamp")
    if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= limits.OFFSET_BUDGET_MAX:
        raise invalid("command envelope with a bad offset budget")
    window = envelope.get("history")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                               or not limits.HISTORY_WINDOW_MIN <= window <= limits.HISTORY_WINDOW_MAX):
        raise invalid("command envelope with a bad history window")
    if rid is not None and (not isinstance(rid, str) or not rid or len(rid) > 2 * limits.REQUEST_ID_CHARS_MAX):
        raise invalid("request id must be a non-empty string")
    try:
        cmd = envelope.get("cmd")
        text = json_body.canonical(cmd)
        # Only a command whose text could hide a violation is walked: nesting is at most as deep as the text has
        # brackets, and orjson writes a non-finite float as null. Of the rest of the envelope, apply reads only the
        # fields checked above (never ``actor``).
        if b"null" in text or text.count(b"{") + text.count(b"[") > json_body.JSON_DEPTH_MAX:
            json_body.check(cmd, "command", strings=False)
    except (ValueError, RecursionError, UnicodeError, TypeError, ApiError):
        raise invalid("the command is not encodable JSON text (a lone surrogate, a non-finite number, an integer "
                      "outside 64 bits or too deep)") from None
    if len(text) > limits.COMMAND_BYTES_MAX:
        raise invalid(f"the command exceeds {limits.COMMAND_BYTES_MAX} bytes")
    if rid is not None and not json_body.is_scalar_text(rid):
        raise invalid("request id is not valid Unicode")
    fingerprint = hashlib.sha256(text).hexdigest()[:32] if rid else None
    return rid, ts, budget, window, fingerprint


def _failed(err: ApiError, version: int) -> Outcome:
    return {"ok": False, "error": {"status": err.status, "code": err.code, "message": err.message,
                                   "details": err.details}, "version": version}
