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


_identity: dict[str, str] = {}


def _add_position(logger, method, event_dict):
    # The process's identity is a module value, not a context variable: threads (the Raft tick thread) start with
    # an empty context and would log without it.
    for k, v in _identity.items():
        event_dict.setdefault(k, v)
    if _position:
        try:
            event_dict.update(_position[0]())
        except Exception:  # logging must never fail the caller
            pass
    return event_dict


def configure(level: str = "info", **identity: str) -> None:
    """Our structlog loggers and every stdlib logger (pysyncobj, aiohttp, SQLAlchemy) write the same JSON lines."""
    numeric = getattr(logging, level.upper(), logging.INFO)
    shared = [
        structlog.contextvars.merge_contextvars,
        _add_position,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(numeric)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, structlog.processors.JSONRenderer()],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
    )
    _identity.update(identity)
