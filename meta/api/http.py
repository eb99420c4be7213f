"""Shared request/response helpers: JSON in and out, the error shape, role checks."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from runtime.credentials import ROLE
from wire import json_body
from wire.errors import ApiError
from wire.params import optional_int
from wire.headers import request_id_header
from wire.shapes import validate
from ..service import MetaService
from .keys import SERVICE

JSON = "application/json"


def service(request: web.Request) -> MetaService:
    return request.app[SERVICE]


def respond(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=json_body.encode(data), status=status, content_type=JSON)


async def body_object(request: web.Request) -> dict[str, Any]:
    return json_body.parse_object(await request.read())


async def body_of(request: web.Request, model: Any) -> dict[str, Any]:
    """The request's JSON object, checked against ``model`` (meta/api/models.py, the spec's source)."""
    return validate(model, await body_object(request))


def refuse_if_no_longer_leader(request: web.Request) -> None:
    """A request another node forwarded here because this node led: if it no longer does, the sender must retry
    (its forwarder reads NO_LEADER as "the leader moved") rather than this node forwarding it on."""
    if "X-Forwarded-By" in request.headers and not service(request).is_leader():
        raise ApiError("this node is no longer the leader", code="NO_LEADER", status=503)


FORWARDED_APPLIED_HEADER = "X-Forwarded-Applied-Version"
FORWARDED_CATCH_UP_S = 2.0   # the most a leader waits to apply what the forwarding node had applied


def replay_on_leader(request: web.Request, body: bytes):
    """``forward(url)``: this request, replayed as it came (with its credentials and idempotency key) on the node at
    ``url``, marked as forwarded by this node, with the version this node had applied (FORWARDED_APPLIED_HEADER)."""
    svc = service(request)
    headers = {"Content-Type": JSON, "X-Forwarded-By": svc.config.node}
    for h in ("Authorization", "Idempotency-Key"):
        if h in request.headers:
            headers[h] = request.headers[h]

    async def forward(url: str):
        headers[FORWARDED_APPLIED_HEADER] = str(svc.applied_version)
        return await svc.forwarder.http(url, request.method, request.path_qs, body, headers)
    return forward


async def on_the_leader(request: web.Request, here, body: bytes):
    """``here(seconds left)`` on the leader: this node when it leads, else replayed there (``replay_on_leader``).
    A replayed request runs once the leader has applied what the forwarding node had: a follower answers writes
    from its own apply, which may run ahead of the leader's, so a broker that registered through a follower and
    sent its first heartbeat next was refused there as unknown (tests/test_openapi_live.py, once in a full suite).
    The wait is bounded (FORWARDED_CATCH_UP_S); past it the request runs as it is."""
    svc = service(request)
    seen = optional_int(request.headers.get(FORWARDED_APPLIED_HEADER), FORWARDED_APPLIED_HEADER) \
        if "X-Forwarded-By" in request.headers else None

    async def caught_up_here(left_s: float):
        if seen is not None and svc.feed.version < seen:
            await svc.feed.wait_version(seen, min(left_s, FORWARDED_CATCH_UP_S))
        return await here(left_s)
    return await svc.forwarder.to_leader(caught_up_here, replay_on_leader(request, body))


async def submit(request: web.Request, cmd: dict[str, Any], ok_status: int = 200) -> web.Response:
    """Hand a command to the log (here or on the leader) and answer with its outcome."""
    svc = service(request)
    refuse_if_no_longer_leader(request)
    status, data = await svc.submit(
        cmd, actor=request[ROLE], idempotency_key=request_id_header(request.headers, "Idempotency-Key"),
        request_id=request_id_header(request.headers, "X-Request-Id"))
    if status == 200 and ok_status != 200:
        status = ok_status
    return respond(data, status)


def expected_version(request: web.Request) -> int | None:
    raw = request.query.get("expected_version")
    return optional_int(raw, "expected_version")


def with_expected_version(request: web.Request, cmd: dict[str, Any]) -> dict[str, Any]:
    """The command, carrying ``?expected_version=V`` when the request names one."""
    ev = expected_version(request)
    if ev is not None:
        cmd["expected_version"] = ev
    return cmd

