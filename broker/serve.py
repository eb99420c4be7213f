"""Running a broker in the foreground until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio


def run_broker(config_path: str) -> None:
    from ops.logging import configure
    from ops.serve import serve_app

    from .api.app import make_app
    from .config import load

    config = load(config_path)
    configure(config.log_level, broker=config.broker)
    asyncio.run(serve_app(make_app(config), config.http_host, config.http_port, config.tls,
                          config.http_connections_max))
