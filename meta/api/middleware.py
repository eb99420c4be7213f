"""Cross-cutting request handling: auth by role, the error shape, metrics, request-scoped log context."""

from __future__ import annotations

import itertools
import time
import uuid

import structlog
from aiohttp import web

from client.wire.errors import ApiError
from .http import error_response
from .keys import METRICS, SERVICE

log = structlog.get_logger("meta.http")
# Log correlation ids for requests that bring none: a counter under a per-process prefix, no syscall per request.
_LOG_ID_PREFIX = uuid.uuid4().hex[:8]
_log_ids = (f"{_LOG_ID_PREFIX}-{i}" for i in itertools.count(1))


def _route_name(request: web.Request) -> str:
    info = request.match_info.route.resource
    return info.canonical if info is not None else "unmatched"


@web.middleware
async def errors_and_auth(request: web.Request, handler) -> web.StreamResponse:
    started = time.perf_counter()
    route = _route_name(request)
    rid = request.headers.get("X-Request-Id") or next(_log_ids)
    structlog.contextvars.bind_contextvars(request_id=rid)
    status = 500
    try:
        roles = getattr(request.match_info.handler, "roles", None)
        if roles is not None:
            request["role"] = _authenticate(request, roles)
        resp = await handler(request)
        status = resp.status
        return resp
    except ApiError as e:
        status = e.status
        return error_response(e)
    except web.HTTPRequestEntityTooLarge as e:
        status = 413
        return error_response(ApiError(f"request body exceeds {e.text or 'the limit'}", code="TOO_LARGE", status=413))
    except web.HTTPException as e:
        status = e.status
        if e.status in (404, 405):
            code = "NOT_FOUND" if e.status == 404 else "METHOD_NOT_ALLOWED"
            return error_response(ApiError(f"{request.method} {request.path}: {e.reason}", code=code, status=e.status))
        raise
    except Exception:
        log.exception("handler_failed", path=request.path)
        return error_response(ApiError("internal error; see the node's log", code="INTERNAL", status=500))
    finally:
        m = request.app[METRICS]
        m.requests.labels(route, str(status)).inc()
        m.latency.labels(route).observe(time.perf_counter() - started)
        structlog.contextvars.unbind_contextvars("request_id")


def _authenticate(request: web.Request, roles: frozenset[str]) -> str:
    auth = request.headers.get("Authorization", "")
    if not auth.startswith("Bearer "):
        raise ApiError("missing bearer token", code="UNAUTHENTICATED", status=401)
    role = request.app[SERVICE].config.tokens.role_of(auth[7:].strip())
    if role is None:
        raise ApiError("unknown token", code="UNAUTHENTICATED", status=401)
    if role not in roles:
        raise ApiError(f"role {role!r} may not call this", code="PERMISSION_DENIED", status=403)
    return role


async def add_version_header(request: web.Request, response: web.StreamResponse) -> None:
    svc = request.app.get(SERVICE)
    if svc is not None and svc.sync is not None:
        response.headers["X-Meta-Version"] = str(svc.applied_version)
