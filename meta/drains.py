"""The leader's side of a drain (issue 37: ``stator broker drain B``, ``stator broker replace B --with C``): while a
broker is marked draining in the log, a step every DRAIN_STEP_INTERVAL_S moves up to DRAIN_QUEUES_PER_STEP of the
heads it holds a copy of onto others (``DrainStep``, decided in meta/deciders/topics.py). Each move is a
seal-then-switch, so a queue pauses as long as a remap's seal; a bounded step spreads those pauses. The mark is in
the log, so a new leader carries a drain on, and an operator stops and resumes it there. The same steps place a copy
of each older segment it holds on another broker; that broker reports it whole (``SealedCopiesHeld``) and the log
then names it instead."""

from __future__ import annotations

import structlog

from .deciders.replicas import heads_holding, sealed_holding
from .log import Log
from .periodic import run_every
from .reads import ReadFacade

log = structlog.get_logger("meta.drains")
DRAIN_STEP_INTERVAL_S = 0.5
DRAIN_QUEUES_PER_STEP = 16


class Drainer:
    def __init__(self, reads: ReadFacade, log_: Log):
        self.reads = reads
        self.log = log_
        self.steps = 0   # drain steps this node proposed while it led

    async def run(self) -> None:
        """A task: cancelled on stop."""
        await run_every(DRAIN_STEP_INTERVAL_S, self._step, "drain_step_failed")

    async def _step(self) -> None:
        if not self.log.is_leader():
            return
        draining = self.reads.read(lambda im: [b for b, v in sorted(im.brokers.items())
                                               if v["draining"] and (heads_holding(im, b)
                                                                     or sealed_holding(im, b))])
        for broker in draining:
            self.steps += 1
            outcome = await self.log.propose({"type": "DrainStep", "broker": broker,
                                              "queues_max": DRAIN_QUEUES_PER_STEP}, None, "system")
            result = outcome.get("result") if outcome.get("ok") else None
            if result and (result["moved"] or result["copying"]):
                log.info("drain_step", broker=broker, moved=len(result["moved"]), copying=len(result["copying"]),
                         remaining=result["remaining"], sealed_remaining=result["sealed_remaining"])
