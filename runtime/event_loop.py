"""The event loop a server process runs on: uvloop's (libuv), not asyncio's own.

A broker's one event loop is its limit (ops/bench/broker_throughput.py): the same aiohttp request costs about a third
less CPU on uvloop, whose transports, futures and callbacks are C, with nothing else changed. Every asyncio API the
servers use (threads' call_soon_threadsafe, run_in_executor, to_thread, signals) behaves the same on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(main) on a new uvloop loop."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
