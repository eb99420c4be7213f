"""The record of every client operation: invoke time, complete time and outcome, as Jepsen and etcd's robustness
tests keep it.

Outcomes: ``ok`` (the answer says it happened), ``fail`` (the answer says it did not: a 4xx refusal), ``unknown`` (no
answer, a timeout, a 5xx, or cut off by the end of the run: it may or may not have taken effect, at any time after
its invocation). Times are seconds on the runner's monotonic clock; an unknown operation completes at infinity.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from typing import Any

from wire.errors import StatorError

OK, FAIL, UNKNOWN = "ok", "fail", "unknown"


@dataclass
class Op:
    process: str            # one client, issuing one operation at a time
    kind: str               # "cas", "read", "read_mv", "send", "commit", "pop", "ack", ...
    input: dict[str, Any]
    invoke: float
    complete: float = math.inf
    outcome: str = UNKNOWN
    output: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["complete"] = None if math.isinf(self.complete) else self.complete
        return d


def outcome_of(e: BaseException) -> str:
    """A refusal (4xx) is a definite failure; anything else leaves the effect unknown."""
    if isinstance(e, StatorError) and 400 <= e.status < 500:
        return FAIL
    return UNKNOWN


class Recorder:
    def __init__(self) -> None:
        self.ops: list[Op] = []
        self._t0 = time.monotonic()
        self._t0_wall = time.time()

    def now(self) -> float:
        return time.monotonic() - self._t0

    def wall_ms(self, t: float) -> float:
        """The wall clock (ms) at ``t`` of this recorder, to compare with times meta stamps into its log."""
        return (self._t0_wall + t) * 1000

    @contextlib.asynccontextmanager
    async def op(self, process: str, kind: str, **input: Any) -> AsyncIterator[Op]:
        """Record one operation: the block fills ``op.output`` and returns normally for ok; an exception is the
        outcome (see ``outcome_of``) and is re-raised for the workload to react to. A cancelled operation (the run
        ended) stays unknown."""
        op = Op(process, kind, input, self.now())
        self.ops.append(op)
        try:
            yield op
        except asyncio.CancelledError:
            op.error = "cancelled"
            raise
        except Exception as e:
            op.outcome = outcome_of(e)
            op.error = f"{type(e).__name__}: {e}"[:300]
            if op.outcome == FAIL:
                op.complete = self.now()
            raise
        else:
            op.outcome = OK
            op.complete = self.now()
