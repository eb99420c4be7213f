"""The meta node's request handling: the wire's error middleware with meta's tokens and metrics, and the version
header every answer carries."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from wire.errors import rejection
from runtime.server import error_middleware, route_name

from .keys import METRICS, SERVICE


def _tokens(app: web.Application) -> dict[str, str]:
    return app[SERVICE].config.tokens.by_role()


def _broker_tokens(app: web.Application) -> Mapping[str, str]:
    return app[SERVICE].config.broker_tokens


UNTIMED_ROUTES = frozenset({"/v1/watch"})


def _observe(request: web.Request, status: int, seconds: float) -> None:
    route = route_name(request)
    # A stream or a wait lasts as long as the client asked, not as long as the work: it would drown the latency.
    timed = route not in UNTIMED_ROUTES and "wait" not in request.query
    request.app[METRICS].observe_request(route, status, seconds if timed else None)


def _refused(request: web.Request, code: str) -> None:
    request.app[METRICS].refusals.labels(code).inc()


errors_and_auth = error_middleware(_tokens, "meta node", _observe, _refused, _broker_tokens)


VERSION_HEADER = "X-Meta-Version"


async def add_version_header(request: web.Request, response: web.StreamResponse) -> None:
    svc = request.app.get(SERVICE)
    if svc is not None:
        response.headers[VERSION_HEADER] = str(svc.applied_version)


# What a node removed from the members still answers: how it sees itself and the cluster, so an operator learns why.
ANSWERED_WHEN_REMOVED = frozenset({"/healthz", "/readyz", "/metrics", "/v1/cluster", "/v1/cluster/members",
                                   "/v1/openapi.json"})


@web.middleware
async def refuse_when_removed(request: web.Request, handler):
    """A node the membership no longer names gets no more of the log: it stops serving (meta/raft/roles.py)."""
    svc = request.app.get(SERVICE)
    if svc is not None and svc.log.removed and request.path not in ANSWERED_WHEN_REMOVED:
        raise rejection(503, "NOT_A_MEMBER", "this meta node was removed from the cluster's members and no longer "
                        "gets the log; stop it, or add it again with `stator cluster members add`",
                        node=svc.config.node)
    return await handler(request)
