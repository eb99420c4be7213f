"""Running a meta node in the foreground until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import signal
import sys

from aiohttp import web

GIL_SWITCH_INTERVAL_S = 0.001


async def serve_app(app: web.Application, host: str, port: int) -> None:
    # handler_cancellation: a long poll or watch whose client went away stops at once instead of holding its
    # waiter slot until its wait ends.
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0,
                           handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True, backlog=2048)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def run_meta(config_path: str) -> None:
    from meta.api.app import make_app
    from meta.config import load
    from ops.logging import configure

    config = load(config_path)
    configure(config.log_level, node=config.node)
    # The Raft tick thread must get the interpreter promptly while the event loop is busy (heartbeats, commits):
    # hand the GIL over every 1 ms instead of every 5 ms.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    asyncio.run(serve_app(make_app(config), config.http_host, config.http_port))
