"""Histories built by hand, event by event, in the stored form the history API serves (meta/events.py ``stored``):
the synthetic input of ``ops.bench.lineage`` and of the lineage tests that plant a fault a real cluster never makes.

Events go through ``meta.events.make``, so a field that is not in an event's schema fails loudly; the sequences
follow meta/state_machine.py (a graceful remap: SegmentSealing and SegmentOpened, then SegmentSealed and
LogicStartDecided; a lock: LockGranted, LockTargetChanged, LockReleased).
"""

from __future__ import annotations

from typing import Any

from meta import allocation
from meta.events import make, stored

BUDGET = 1_000_000


class History:
    def __init__(self, start_ms: int = 1_767_225_600_000, step_ms: int = 1):
        self.events: list[dict[str, Any]] = []
        self.version = 0
        self.ts = start_ms
        self.step_ms = step_ms
        self.topics: dict[str, dict[str, Any]] = {}
        self.token = 0

    def add(self, event_type: str, **fields: Any) -> dict[str, Any]:
        self.version += 1
        self.ts += self.step_ms
        e = stored(self.version, self.ts, make(event_type, **fields))
        self.events.append(e)
        return e

    def skip(self, versions: int) -> None:
        """Leave a hole of ``versions`` versions (a fault an export must never have)."""
        self.version += versions

    # topics and segments
    def create_topic(self, topic: str, brokers: list[str], queues: int) -> int:
        incarnation = self.version + 1
        segs = [{"queue": q, "broker": brokers[q % len(brokers)],
                 "physical_queue": allocation.physical_queue_name(topic, incarnation, q, 0), "budget_end": BUDGET,
                 "replicas": [brokers[q % len(brokers)]]}
                for q in range(queues)]
        self.add("TopicCreated", replicas=1, min_insync=1, scope="global", topic=topic, incarnation=incarnation, queues=queues, slots=max(queues, 16),
                 order="best_tried", config={}, slot_table=allocation.initial_slot_table(max(queues, 16), queues),
                 segments=segs)
        self.topics[topic] = {"incarnation": incarnation,
                              "heads": [{"gen": 0, "broker": s["broker"], "logic_start": 0} for s in segs]}
        return incarnation

    def remap(self, topic: str, queue: int, to: str, written: int, logic_start: int | None = None) -> None:
        """Seal the head after ``written`` messages and continue on ``to`` (``logic_start`` plants another start)."""
        t = self.topics[topic]
        head = t["heads"][queue]
        gen = head["gen"] + 1
        end = head["logic_start"] + written
        self.add("SegmentSealing", topic=topic, queue=queue, gen=head["gen"], broker=head["broker"])
        self.add("SegmentOpened", topic=topic, queue=queue, gen=gen, broker=to, replicas=[to], in_sync=[to], from_broker=head["broker"],
                 physical_queue=allocation.physical_queue_name(topic, t["incarnation"], queue, gen),
                 physical_start=0, budget_end=BUDGET, cause="remap")
        self.add("SegmentSealed", topic=topic, queue=queue, gen=head["gen"], broker=head["broker"],
                 physical_end=written, logic_end=end, by="broker")
        start = end if logic_start is None else logic_start
        self.add("LogicStartDecided", topic=topic, queue=queue, gen=gen, logic_start=start)
        t["heads"][queue] = {"gen": gen, "broker": to, "logic_start": start}

    def budget(self, topic: str, queue: int, budget_end: int) -> None:
        head = self.topics[topic]["heads"][queue]
        self.add("OffsetBudgetGranted", topic=topic, queue=queue, gen=head["gen"], broker=head["broker"],
                 budget_end=budget_end)

    def delete_topic(self, topic: str) -> None:
        self.add("TopicDeleted", topic=topic)
        del self.topics[topic]

    # locks
    def grant(self, group: str, topic: str, queue: int, member: str) -> int:
        self.token += 1
        self.add("LockGranted", group=group, topic=topic, queue=queue, member=member, token=self.token)
        return self.token

    def target(self, group: str, topic: str, queue: int, member: str, token: int, target: str | None) -> None:
        self.add("LockTargetChanged", group=group, topic=topic, queue=queue, member=member, token=token, target=target)

    def release(self, group: str, topic: str, queue: int, member: str, token: int, reason: str = "released") -> None:
        self.add("LockReleased", group=group, topic=topic, queue=queue, member=member, token=token, reason=reason)
