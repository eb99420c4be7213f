"""The broker's one fencing gate (broker/fencing.py): every fenced read and commit passes it, in one order of checks.

The first part drives a real FencingGate over a real LockTable and Barriers; the second asks a real broker process,
route by route, to read and commit with a stale token or behind a held barrier.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from broker.fencing import FencingGate
from broker.locks import Barriers, LockTable
from wire.errors import ApiError

ROOT = pathlib.Path(__file__).resolve().parent.parent


class Routes:
    def __init__(self, routes: dict):
        self.routes = routes


class Positions:
    def __init__(self, committed: int = -1):
        self.committed = committed
        self.asks = 0

    async def committed_of(self, group: str, topic: str, queue: int) -> int:
        self.asks += 1
        return self.committed

    async def min_of(self, topic: str, queue: int) -> int:
        return 0


GROWN = {"topic": "t", "version": 3, "barriers": [{"queue": 1, "after_queue": 0, "after_offset": 4}]}


def gate(ready: bool = True, mode: str = "exclusive", committed: int = -1) -> tuple[FencingGate, Positions]:
    locks = LockTable(lambda: ready)
    locks.apply({"group": "g", "version": 10, "mode": mode, "locks": {"t": [5, 6]}, "tokens_through": 6})
    p = Positions(committed)
    return FencingGate(locks, Barriers(p.committed_of, p.min_of), Routes({"t": GROWN})), p


async def refused(coro) -> tuple[int, str]:
    with pytest.raises(ApiError) as e:
        await coro
    return e.value.status, e.value.code


async def test_a_pull_without_a_group_is_not_fenced_even_before_the_broker_followed_the_log():
    g, p = gate(ready=False)
    assert await g.pull(None, "t", 1, None) is None and p.asks == 0


async def test_a_stale_token_is_refused_on_pull_and_commit():
    g, _ = gate()
    for token in (None, 6):
        assert await refused(g.pull("g", "t", 0, token)) == (409, "STALE_TOKEN")
        assert await refused(g.commit("g", "t", 0, token)) == (409, "STALE_TOKEN")
    assert await g.pull("g", "t", 0, 5) is None
    await g.commit("g", "t", 0, 5)


async def test_nothing_naming_a_group_passes_before_the_broker_followed_the_log():
    g, _ = gate(ready=False)
    assert await refused(g.pull("g", "t", 0, 5)) == (503, "LOCKS_CATCHING_UP")
    assert await refused(g.commit("g", "t", 0, 5)) == (503, "LOCKS_CATCHING_UP")


async def test_the_token_is_checked_before_the_barrier():
    g, p = gate()
    assert await refused(g.pull("g", "t", 1, 5)) == (409, "STALE_TOKEN")
    assert p.asks == 0, "a refused token never reads the group's position"
    assert await g.pull("g", "t", 1, 6) == {"queue": 0, "after_offset": 4}
    p.committed = 4
    assert await g.pull("g", "t", 1, 6) is None


async def test_the_barrier_is_passed_at_the_pulling_groups_own_position():
    """Another group's commit past the split point releases nothing: the gate asks for the pulling group's offset."""
    committed = {"other": 10}

    async def committed_of(group: str, topic: str, queue: int) -> int:
        return committed.get(group, -1)

    async def min_of(topic: str, queue: int) -> int:
        return 0

    locks = LockTable(lambda: True)
    locks.apply({"group": "g", "version": 10, "mode": "exclusive", "locks": {"t": [5, 6]}, "tokens_through": 6})
    g = FencingGate(locks, Barriers(committed_of, min_of), Routes({"t": GROWN}))
    assert await g.pull("g", "t", 1, 6) == {"queue": 0, "after_offset": 4}
    committed["g"] = 4
    assert await g.pull("g", "t", 1, 6) is None


async def test_only_an_exclusive_group_waits_behind_a_barrier():
    g, p = gate(mode="shared")
    assert await g.pull("g", "t", 1, None) is None and p.asks == 0


def test_the_broker_handlers_ask_the_gate_and_never_the_locks_barriers_or_routes():
    tree = ast.parse((ROOT / "broker" / "api" / "app.py").read_text())
    touched = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
               and isinstance(n.value, ast.Name) and n.value.id == "node"}
    assert "gate" in touched
    assert not touched & {"locks", "barriers"}, touched
    routes_reads = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Attribute) and n.value.attr == "routes"}
    assert routes_reads <= {"version"}, f"handlers read only the route version, not routes: {routes_reads}"


# -- a real broker -------------------------------------------------------------------------------------------------

from tests.support.broker_http import admin, all_writable, send, wait_route       # noqa: E402
from tests.support.group_locks_http import a_owns_all, code, commit, pull, topic  # noqa: E402
from tests.support.group_locks_http import two_brokers                            # noqa: E402,F401  (a fixture)
from tests.support.group_members import short_leases                             # noqa: E402
from tests.support.meta_http import wait_until                                    # noqa: E402


def split_decided(r: dict) -> bool:
    return len(r["queues"]) == 2 and all_writable(r) and any(x["after_offset"] is not None for x in r["barriers"])


async def test_each_fenced_route_of_a_broker_refuses_a_stale_token_and_holds_behind_a_barrier(two_brokers):
    c = two_brokers
    await topic(c, "t", 1, 4, slots=16)   # t grows from one queue of 4 messages to two: queue 1 waits for offset 4
    await short_leases(c)
    grown = await admin(c, "PATCH", 0, "/v1/topics/t", json={"queues": 2})
    assert grown[0] == 200, grown
    r = await wait_route(c, "t", split_decided)
    await send(c, "t", 1, ["moved-key"])
    tokens = await wait_until(lambda: a_owns_all(c, 2), 10, "a to own both queues")
    for q in (0, 1):   # the current token passes, once the broker heard of the grant (it waits for it)
        s, b = await pull(c, r, q, tokens[q])
        assert s == 200, b

    for q, other in ((0, 1), (1, 0)):
        # GET /v1/messages/{topic}/{queue}?group=: another queue's token, and none, are stale
        assert code(*await pull(c, r, q, tokens[other])) == (409, "STALE_TOKEN")
        assert code(*await pull(c, r, q)) == (409, "STALE_TOKEN")
        # PUT /v1/offsets/{group}/{topic}/{queue}
        assert code(*await commit(c, r, q, 1, tokens[other])) == (409, "STALE_TOKEN")
        assert code(*await commit(c, r, q, 1)) == (409, "STALE_TOKEN")

    # GET /v1/messages: the moved-to queue is held until the group committed past the split point on queue 0
    s, b = await pull(c, r, 1, tokens[1])
    assert s == 200 and b["messages"] == [] and b["held_by"] == {"queue": 0, "after_offset": 4}, b
    assert code(*await commit(c, r, 0, 4, tokens[0])) == (200, None)
    s, b = await pull(c, r, 1, tokens[1])
    assert s == 200 and [m["offset"] for m in b["messages"]] == [0] and "held_by" not in b, b
