"""A node's proposals between two ticks, handed to pysyncobj as one log entry (meta/raft/entry.py).

Why batches: every entry costs each node a journal record, a place in an append message, pysyncobj's bookkeeping,
a hand-off to the apply thread and a commit callback, and every follower's proposal cost a raft message to the
leader and one back. Under 64 writers a tick used to append dozens of one-command entries; now each node hands the
log at most one entry per tick (more only past the size or count bound), and a follower forwards one message.

The event loop adds proposals (``add``); the tick takes them (``take``) before pysyncobj drains its command
queue. ``batch_callback`` gives pysyncobj one callback per entry that answers each proposal with its own outcome.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pysyncobj import FAIL_REASON

from .applier import DISCARDED, Pending
from .entry import ENVELOPE_BYTES_MAX, PROPOSALS_PER_ENTRY_MAX, STAMP_BYTES_MAX

Callback = Callable[[Any, int], None]   # (outcome or DISCARDED, pysyncobj's FAIL_REASON)


@dataclass
class Batch:
    envelopes: list[bytes] = field(default_factory=list)
    callbacks: list[Callback] = field(default_factory=list)
    payload_bytes: int = STAMP_BYTES_MAX   # as encoded: the stamp line, then a newline and each envelope

    def fits(self, envelope: bytes) -> bool:
        return (len(self.envelopes) < PROPOSALS_PER_ENTRY_MAX
                and self.payload_bytes + 1 + len(envelope) <= ENVELOPE_BYTES_MAX)

    def add(self, envelope: bytes, callback: Callback) -> None:
        self.envelopes.append(envelope)
        self.callbacks.append(callback)
        self.payload_bytes += 1 + len(envelope)


class Proposals:
    """Proposals waiting for the next tick, at most ``count_max`` of them (then ``add`` refuses: OVERLOADED)."""

    def __init__(self, count_max: int):
        self.count_max = count_max
        self._lock = threading.Lock()
        self._waiting: list[tuple[bytes, Callback]] = []

    def add(self, envelope: bytes, callback: Callback) -> bool:
        """Event loop: queue one envelope (at most ENVELOPE_BYTES_MAX - STAMP_BYTES_MAX - 1 bytes); False if full."""
        with self._lock:
            if len(self._waiting) >= self.count_max:
                return False
            self._waiting.append((envelope, callback))
            return True

    def take(self) -> list[Batch]:
        """The tick: everything waiting, in order, packed into as few entries as the bounds allow."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
        batches: list[Batch] = []
        for envelope, callback in waiting:
            if not batches or not batches[-1].fits(envelope):
                batches.append(Batch())
            batches[-1].add(envelope, callback)
        return batches

    def __len__(self) -> int:
        with self._lock:
            return len(self._waiting)


def batch_callback(callbacks: list[Callback], lock: threading.Lock) -> Callback:
    """pysyncobj's callback for one entry. On success it hands back the entry's ``Pending`` (meta/raft/applier.py),
    whose outcome is the list of the proposals' outcomes, in order; a failure (not appended, leadership lost) is
    the same for every proposal of the entry."""
    def done(result: Any, err: int) -> None:   # the tick (on the loop, or its watchdog thread)
        if err == FAIL_REASON.SUCCESS and isinstance(result, Pending):
            result.then(lambda outcomes: _each(callbacks, outcomes), lock)
        else:
            for callback in callbacks:
                callback(result, err)
    return done


def _each(callbacks: list[Callback], outcomes: Any) -> None:   # the apply thread, or the tick if applied
    if not isinstance(outcomes, list) or len(outcomes) != len(callbacks):
        # DISCARDED: a snapshot installed from the leader covered the entry before it was applied here.
        outcomes = [DISCARDED] * len(callbacks)
    for callback, outcome in zip(callbacks, outcomes):
        callback(outcome, FAIL_REASON.SUCCESS)
