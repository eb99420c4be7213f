"""The state machine's decisions, one file per domain: which command is decided where.

- ``brokers.py``   RegisterBroker, FenceBroker, UnfenceBroker, GrantOffsetBudget (a broker's session, its epochs and
                   its write budgets)
- ``topics.py``    CreateTopic, GrowTopic, SetTopicConfig, DeleteTopic, RemapTopic (and the seal-then-switch of one
                   queue that a remap and a growth make: ``topics.move``)
- ``replicas.py``  AlterInSync (who is in sync, asked by a head's leader), ElectLeaders (an operator's election,
                   unclean only when asked), and what losing a broker decides: its
                   heads fail over to in-sync replicas (``broker_lost``, from a fence or a new registration)
- ``lookups.py``   no command: what several of them read alike (the broker a command names, a seal at the budget)
- ``segments.py``  SealSegment, SealSegments (a broker reports where a segment being sealed ends)
- ``groups.py``    JoinGroup, LeaveGroup, ExpireMembers, ReleaseLocks, ExpireLocks, SetGroupConfig (members and
                   locks; who gets which queue is meta/groups.py)
- ``history.py``   Barrier (a no-op a linearizable read waits on) and the history window an envelope carries

Every file ends with its ``DECIDERS`` table, command type -> decider; meta/state_machine.py dispatches through the
union of these tables (its ``DECIDERS``). A decider is a pure function ``(image, cmd, ts, budget) -> (events,
result)``: ``cmd`` passed meta/commands.py's static validation, ``ts`` is the leader's stamp and ``budget`` the offset
budget a new segment is granted. It reads the image and never changes it (the events it returns do, when replayed);
a rejection is a raised ``ApiError``. No clock, randomness or I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wire.errors import ApiError, rejection

Events = list[dict[str, Any]]
Decider = Callable[[Any, dict[str, Any], int, int], tuple[Events, dict[str, Any]]]


def decide_each(items: list[dict[str, Any]], decide: Callable[[dict[str, Any]], tuple[Events, dict[str, Any]]]
                ) -> tuple[Events, dict[str, Any]]:
    """Many items of one command (seal reports, in-sync changes), each decided on its own: a refused one is an item
    ``{"ok": false, "code", "status"}`` of the result and changes nothing; the others apply, in order."""
    events: Events = []
    results = []
    for item in items:
        try:
            decided, result = decide(item)
        except ApiError as e:
            results.append({"ok": False, "code": e.code, "status": e.status})
        else:
            events += decided
            results.append({"ok": True, **result})
    return events, {"results": results}


def expect_version(cmd: dict[str, Any], current: int) -> None:
    """A command's optional ``expected_version`` (of a topic or a group) must be the current one."""
    ev = cmd.get("expected_version")
    if ev is not None and ev != current:
        raise rejection(409, "VERSION_MISMATCH", f"expected version {ev}, current is {current}",
                        current_version=current, expected_version=ev)
