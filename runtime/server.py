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

from runtime.connection_limit import CONNECTION_LIMIT
from runtime.credentials import BROKER, ROLE, broker_of
from wire.errors import ApiError

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


_UNDECLARED = object()   # a handler marked neither @requires nor @public


def require_declared_roles(app: web.Application, what: str) -> None:
    """Refuse to serve an app with a route whose handler says nobody's role (neither ``@requires`` nor ``@public``):
    authentication fails closed, at start-up, not open on the first request."""
    undeclared = sorted({f"{r.method} {r.resource.canonical}" for r in app.router.routes()
                         if getattr(r.handler, "roles", _UNDECLARED) is _UNDECLARED})
    if undeclared:
        raise RuntimeError(f"{what}: routes whose handler declares no role (@requires or @public): {undeclared}")


def role_of(token: str, tokens: Mapping[str, str | None]) -> str | None:
    """The role whose token this is, compared in constant time (no early exit, no short-circuit compare)."""
    presented = token.encode("utf-8", "surrogateescape")  # aiohttp decodes header bytes with surrogateescape
    found = None
    for role in ROLES:
        expected = tokens.get(role)
        if expected and hmac.compare_digest(presented, expected.encode()):
            found = found or role
    return found


def authenticate(request: web.Request, tokens: Mapping[str, str | None], allowed: frozenset[str],
                 broker_tokens: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """(role, broker id): a broker is known by its own token only (credentials.py), never by a shared one."""
    auth = request.headers.get("Authorization", "")
    if not auth.startswith("Bearer "):
        raise ApiError("missing bearer token", code="UNAUTHENTICATED", status=401)
    presented = auth[7:].strip()
    role = role_of(presented, {r: t for r, t in tokens.items() if r != "broker"})
    # A shared token's role wins over a broker's (so its hash, a sha256 per request, is not needed then)
    broker = broker_of(presented, broker_tokens) if role is None and broker_tokens else None
    if broker is not None:
        role = "broker"
    if role is None:
        raise ApiError("unknown token", code="UNAUTHENTICATED", status=401)
    if role not in allowed:
        raise ApiError(f"role {role!r} may not call this", code="PERMISSION_DENIED", status=403)
    return role, broker if role == "broker" else None


def error_response(err: ApiError) -> web.Response:
    return web.Response(body=json.dumps(err.to_dict(), separators=(",", ":")).encode(), status=err.status,
                        content_type="application/json")


def route_name(request: web.Request) -> str:
    info = request.match_info.route.resource
    return info.canonical if info is not None else "unmatched"


# A probe's own 503 answers the question it was asked ("not ready yet"): counted as a refusal, every start and
# every election would raise the refusals an operator alerts on. A probe refused before it was asked (the
# connection limit, a malformed request) still counts.
PROBES = frozenset({"/healthz", "/readyz"})


def error_middleware(tokens: Callable[[web.Application], Mapping[str, str | None]], what: str,
                     observe: Callable[[web.Request, int, float], None],
                     refused: Callable[[web.Request, str], None] | None = None,
                     broker_tokens: Callable[[web.Application], Mapping[str, str]] | None = None):
    """The middleware of a service: authenticate by the handler's marker (the admin and client tokens of
    ``tokens(app)``, each broker's own token by its hash in ``broker_tokens(app)``; the request keeps "role" and
    "broker", the id a broker caller proved), answer every error in API.md's shape,
    and report each request's status and duration to ``observe(request, status, seconds)`` and each error answer's
    code to ``refused(request, code)`` (the refusals metric: limits show there by their codes). A request on a
    connection past the server's connection limit (connection_limit.py) is refused first, and its connection closed."""
    log = structlog.get_logger(f"{what}.http")

    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:
        started = time.perf_counter()
        structlog.contextvars.bind_contextvars(request_id=request.headers.get("X-Request-Id") or next(_log_ids))
        status = 500
        code: str | None = None   # the API code of an error answer
        try:
            limit = request.app.get(CONNECTION_LIMIT)
            if limit is not None:
                limit.check(request)
            roles = getattr(request.match_info.handler, "roles", _UNDECLARED)
            if roles is _UNDECLARED:
                # A route nobody declared roles for (require_declared_roles refuses such an app at start-up): refused.
                # Unmatched paths (404/405) have no marker either, and answer as such.
                if request.match_info.http_exception is None:
                    raise ApiError("this route declares no role: refused", code="PERMISSION_DENIED", status=403)
            elif roles is not None:
                request[ROLE], request[BROKER] = authenticate(
                    request, tokens(request.app), roles, broker_tokens(request.app) if broker_tokens else None)
            resp = await handler(request)
            status = resp.status
            if status >= 400:
                code = f"HTTP_{status}"
            return resp
        except ApiError as e:
            status, code = e.status, e.code
            resp = error_response(e)
            if code == "TOO_MANY_CONNECTIONS":
                resp.force_close()
            return resp
        except web.HTTPRequestEntityTooLarge as e:
            status, code = 413, "TOO_LARGE"
            return error_response(ApiError(f"request body exceeds {e.text or 'the limit'}", code="TOO_LARGE",
                                           status=413))
        except web.HTTPException as e:
            status = e.status
            code = f"HTTP_{status}" if status >= 400 else None
            if e.status in (404, 405):
                code = "NOT_FOUND" if e.status == 404 else "METHOD_NOT_ALLOWED"
                return error_response(ApiError(f"{request.method} {request.path}: {e.reason}", code=code,
                                               status=e.status))
            raise
        except Exception:
            log.exception("handler_failed", path=request.path)
            code = "INTERNAL"
            return error_response(ApiError(f"internal error; see the {what}'s log", code="INTERNAL", status=500))
        finally:
            observe(request, status, time.perf_counter() - started)
            probe_answer = request.path in PROBES and code is not None and code.startswith("HTTP_")
            if refused is not None and code is not None and not probe_answer:
                refused(request, code)
            structlog.contextvars.unbind_contextvars("request_id")

    return middleware
