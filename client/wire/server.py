"""The server side of the wire, shared by meta and broker: token roles, handler markers, and one error middleware.

Every answer that is not a success has API.md's shape ``{"error": {"code", "message", "details"}}``; an unexpected
exception is logged and answered 500 INTERNAL, never a traceback. Handlers are marked with the roles that may call
them (``requires``) or as open to anyone (``public``); admin may call everything that needs a token.
"""

from __future__ import annotations

import hmac
import itertools
import json
import time
import uuid
from collections.abc import Callable, Mapping

import structlog
from aiohttp import web

from .errors import ApiError

ROLES = ("admin", "broker", "client")
# Log correlation ids for requests that bring none: a counter under a per-process prefix, no syscall per request.
_LOG_ID_PREFIX = uuid.uuid4().hex[:8]
_log_ids = (f"{_LOG_ID_PREFIX}-{i}" for i in itertools.count(1))


def requires(*roles: str):
    """Mark a handler with the roles allowed to call it (admin is allowed everywhere)."""
    def mark(handler):
        handler.roles = frozenset(roles) | {"admin"}
        return handler
    return mark


def public(handler):
    handler.roles = None
    return handler


def role_of(token: str, tokens: Mapping[str, str | None]) -> str | None:
    """The role whose token this is, compared in constant time (no early exit, no short-circuit compare)."""
    presented = token.encode("utf-8", "surrogateescape")  # aiohttp decodes header bytes with surrogateescape
    found = None
    for role in ROLES:
        expected = tokens.get(role)
        if expected and hmac.compare_digest(presented, expected.encode()):
            found = found or role
    return found


def authenticate(request: web.Request, tokens: Mapping[str, str | None], allowed: frozenset[str]) -> str:
    auth = request.headers.get("Authorization", "")
    if not auth.startswith("Bearer "):
        raise ApiError("missing bearer token", code="UNAUTHENTICATED", status=401)
    role = role_of(auth[7:].strip(), tokens)
    if role is None:
        raise ApiError("unknown token", code="UNAUTHENTICATED", status=401)
    if role not in allowed:
        raise ApiError(f"role {role!r} may not call this", code="PERMISSION_DENIED", status=403)
    return role


def error_response(err: ApiError) -> web.Response:
    return web.Response(body=json.dumps(err.to_dict(), separators=(",", ":")).encode(), status=err.status,
                        content_type="application/json")


def route_name(request: web.Request) -> str:
    info = request.match_info.route.resource
    return info.canonical if info is not None else "unmatched"


def error_middleware(tokens: Callable[[web.Application], Mapping[str, str | None]], what: str,
                     observe: Callable[[web.Request, int, float], None]):
    """The middleware of a service: authenticate by the handler's marker, answer every error in API.md's shape,
    and report each request's status and duration to ``observe(request, status, seconds)``."""
    log = structlog.get_logger(f"{what}.http")

    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:
        started = time.perf_counter()
        structlog.contextvars.bind_contextvars(request_id=request.headers.get("X-Request-Id") or next(_log_ids))
        status = 500
        try:
            roles = getattr(request.match_info.handler, "roles", None)
            if roles is not None:
                request["role"] = authenticate(request, tokens(request.app), roles)
            resp = await handler(request)
            status = resp.status
            return resp
        except ApiError as e:
            status = e.status
            return error_response(e)
        except web.HTTPRequestEntityTooLarge as e:
            status = 413
            return error_response(ApiError(f"request body exceeds {e.text or 'the limit'}", code="TOO_LARGE",
                                           status=413))
        except web.HTTPException as e:
            status = e.status
            if e.status in (404, 405):
                code = "NOT_FOUND" if e.status == 404 else "METHOD_NOT_ALLOWED"
                return error_response(ApiError(f"{request.method} {request.path}: {e.reason}", code=code,
                                               status=e.status))
            raise
        except Exception:
            log.exception("handler_failed", path=request.path)
            return error_response(ApiError(f"internal error; see the {what}'s log", code="INTERNAL", status=500))
        finally:
            observe(request, status, time.perf_counter() - started)
            structlog.contextvars.unbind_contextvars("request_id")

    return middleware
