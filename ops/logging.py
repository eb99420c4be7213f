"""structlog as JSON lines on stderr, with the process's identity bound into every line."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import structlog


_position: list[Callable[[], dict[str, Any]]] = []


def set_position_provider(fn: Callable[[], dict[str, Any]]) -> None:
    """Register where the current Raft term and applied version come from; every log line carries them."""
    _position[:] = [fn]


def _add_position(logger, method, event_dict):
    if _position:
        try:
            event_dict.update(_position[0]())
        except Exception:  # logging must never fail the caller
            pass
    return event_dict


def configure(level: str = "info", **identity: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, level.upper(), logging.INFO), format="%(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            _add_position,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper(), logging.INFO)),
    )
    structlog.contextvars.bind_contextvars(**identity)
