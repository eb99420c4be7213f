"""How an answer gets from the tick to the coroutine that waits for it (meta/raft/node.py LoopBridge, and
wire/waits.py result_within, the wait of every proposal and read index).

The tick runs on the event loop. When its last poll read something, the loop queues another tick behind whatever
the tick queued (meta/raft/loop_ticker.py). An answer that went through ``call_soon`` and then through
``asyncio.wait_for``'s own future woke its writer two callbacks later, after that next tick: a 1-client write
waited a whole tick more (seen in a timeline of one write across the three nodes).
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from meta.raft.node import LoopBridge
from wire.waits import result_within


async def test_a_flush_on_the_loop_thread_runs_what_was_posted_at_once():
    bridge = LoopBridge()
    bridge.loop, bridge.loop_thread = asyncio.get_running_loop(), threading.get_ident()
    ran: list[int] = []
    bridge.post(ran.append, 1)
    bridge.post(ran.append, 2)
    bridge.flush()
    assert ran == [1, 2]


async def test_a_failing_callback_costs_the_others_nothing_and_the_flush_does_not_raise():
    bridge = LoopBridge()
    bridge.loop, bridge.loop_thread = asyncio.get_running_loop(), threading.get_ident()
    ran: list[int] = []
    bridge.post(lambda: 1 / 0)
    bridge.post(ran.append, 2)
    bridge.flush()   # in the tick: an exception here would end the tick early
    assert ran == [2]


async def test_a_flush_from_another_thread_runs_on_the_loop():
    loop = asyncio.get_running_loop()
    bridge = LoopBridge()
    bridge.loop, bridge.loop_thread = loop, threading.get_ident()
    ran: list[int] = []
    bridge.post(lambda: ran.append(threading.get_ident()))
    thread = threading.Thread(target=bridge.flush)
    thread.start()
    thread.join(5)
    for _ in range(100):
        if ran:
            break
        await asyncio.sleep(0.01)
    assert ran == [threading.get_ident()]


async def test_an_answer_wakes_its_waiter_before_a_callback_queued_after_it():
    # The tick resolves the future, then the loop queues the next tick: the waiter must run first
    loop = asyncio.get_running_loop()
    order: list[str] = []
    fut = loop.create_future()

    async def waiter() -> None:
        assert await result_within(fut, 5.0) == "answer"
        order.append("answered")

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0)   # the waiter awaits the future now
    fut.set_result("answer")
    loop.call_soon(order.append, "next tick")
    await task
    assert order == ["answered", "next tick"]


async def test_no_answer_in_time_is_a_timeout_and_the_future_is_cancelled():
    # the tick's late answer then finds it done (node._resolve) and is dropped
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    with pytest.raises(TimeoutError):
        await result_within(fut, 0.05)
    assert fut.cancelled()
    answered = loop.create_future()
    answered.set_result(1)
    assert await result_within(answered, 60.0) == 1


async def test_a_cancel_of_the_waiter_is_a_cancel_not_a_timeout():
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    task = asyncio.create_task(result_within(fut, 60.0))
    await asyncio.sleep(0)   # it awaits the future now
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fut.cancelled()


async def test_a_future_cancelled_by_another_is_a_cancel_not_a_timeout():
    # Only the wait's own timer makes a TimeoutError; a proposal cancelled elsewhere stays a cancel
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    loop.call_soon(fut.cancel)
    with pytest.raises(asyncio.CancelledError):
        await result_within(fut, 60.0)

