"""Pop's service on a real broker node in the test's process: the routes given directly, as the watch stream would,
and the helpers the pop tests share (tests/test_pop_service.py, test_pop_deliveries.py, test_pop_refusals.py,
test_pop_takeover.py). Tests use the ``node`` fixture by importing it."""

from __future__ import annotations

import asyncio
import time

import pytest

from broker.pop import service as service_mod
from broker.pop.metrics import PopCollector
from wire import route as route_model
from wire.errors import ApiError

KEY = ("g", "t", 0)
WAIT_S = 10.0       # a delivery coming due, a dead letter landing: well within this on a loaded machine
STOP_S = 10.0       # the pop service's stop: its tasks cancelled, its journal written


def seg(gen: int, broker: str, logic_start: int | None, logic_end: int | None, state: str,
        physical_start: int = 0, replicas: list[str] | None = None, in_sync: list[str] | None = None,
        sealer: str | None = None) -> dict:
    return route_model.segment_json(gen=gen, broker=broker, address="http://127.0.0.1:1",
                                    physical_queue=f"t.q0.g{gen}", physical_start=physical_start,
                                    logic_start=logic_start, logic_end=logic_end, state=state,
                                    budget_end=1_000_000, replicas=replicas, in_sync=in_sync, sealer=sealer)


def route(version: int, segments: list[dict], queues: int = 1, writable: bool = True) -> dict:
    others = [route_model.queue_json(q, True, [dict(segments[-1], physical_queue=f"t.q{q}.g0")])
              for q in range(1, queues)]
    return route_model.route_json(topic="t", version=version, slots=16, order="best_tried", config={},
                                  slot_table=[[0, 16, 0]], slot_table_version=version, barriers=[],
                                  queues=[route_model.queue_json(0, writable, segments), *others])


def one_head(version: int = 5, broker: str = "b1") -> dict:
    return route(version, [seg(0, broker, 0, None, "active")])


def restarted_service(node):
    """The pop service b1 would start with after a restart: the same data directory, routes and settings."""
    return service_mod.PopService("b1", node.config.data_dir, node.routes, node.reader, lambda: True,
                                  node.pop.settings, node.pop.signals)


@pytest.fixture
async def node(broker_node):
    """b1 heading queue 0 of topic t, its pop service and its client to other brokers started (older heads are
    asked over HTTP; the routes here give them an address where nothing listens)."""
    broker_node.routes.update(one_head())
    await broker_node.peers.start()
    await broker_node.pop.start()
    try:
        yield broker_node
    finally:
        try:
            async with asyncio.timeout(STOP_S):   # a background task that ignores its cancel fails here, not hangs
                await broker_node.pop.stop()
        finally:
            await broker_node.peers.stop()


async def until(what, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "not within the wait"
        await asyncio.sleep(0.02)


def max_attempts(node, group: str, value: int, version: int = 1) -> None:
    node.pop.settings.apply({"group": group, "version": version, "config": {"max_attempts": value}})


def told(logs: list[dict], *events: str) -> list[dict]:
    """What pop told an operator (structlog events captured with ``structlog.testing.capture_logs``), without their
    level; only ``events`` when named."""
    return [{k: v for k, v in e.items() if k != "log_level"} for e in logs if not events or e["event"] in events]


def metrics(node) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in PopCollector(node.pop).collect():
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def pop(node, n: int = 10, invisible_ms: int = 60_000, queue: int | None = 0, order: bool = False,
              group: str = "g"):
    return await node.pop.pop("t", group, n, invisible_ms, queue, order, 0)


def answer_reads(node, monkeypatch, answers: list) -> list[int]:
    """The dead letters' reads of message contents (``reader.read_history``) answered from ``answers`` in turn (an
    ApiError is raised, None reads the real store), then by the real store; returns the offsets asked, in order."""
    real = node.pop.reader.read_history
    asked: list[int] = []

    async def read_history(topic: str, queue: int, offset: int, max_n: int) -> dict:
        asked.append(offset)
        answer = answers.pop(0) if answers else None
        if isinstance(answer, ApiError):
            raise answer
        return answer if answer is not None else await real(topic, queue, offset, max_n)

    monkeypatch.setattr(node.pop.reader, "read_history", read_history)
    return asked


async def dead_letter_after_one_attempt(node, body: str = "m"):
    """A message popped once under max_attempts 1, due again within 50 ms: its next step is the dead-letter queue."""
    max_attempts(node, "g", 1)
    await node.writer.send("t", 0, [{"body": body}])
    [d] = await pop(node, 1, invisible_ms=50)
    return d


def two_queues(node) -> None:
    node.routes.update(route(6, [seg(0, "b1", 0, None, "active")], queues=2))
