"""Shared request/response helpers: JSON in and out, the error shape, role checks."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from client.wire import json_body
from client.wire.errors import ApiError, invalid
from client.wire.headers import request_id_header
from client.wire.server import public, requires  # noqa: F401 - the handlers' markers, re-exported
from ..service import MetaService
from .keys import SERVICE

JSON = "application/json"


def service(request: web.Request) -> MetaService:
    return request.app[SERVICE]


def respond(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(data, separators=(",", ":")).encode(), status=status, content_type=JSON)


async def body_object(request: web.Request) -> dict[str, Any]:
    return json_body.parse_object(await request.read())


async def submit(request: web.Request, cmd: dict[str, Any], ok_status: int = 200) -> web.Response:
    """Hand a command to the log (here or on the leader) and answer with its outcome."""
    svc = service(request)
    body = await request.read()

    async def forward(url: str, request_id: str | None):
        headers = {"Content-Type": JSON, "X-Forwarded-By": svc.config.node}
        if request_id:
            headers["X-Request-Id"] = request_id
        for h in ("Authorization", "Idempotency-Key"):
            if h in request.headers:
                headers[h] = request.headers[h]
        return await svc.forwarder.http(url, request.method, request.path_qs, body, headers)

    if "X-Forwarded-By" in request.headers and not svc.is_leader():
        raise ApiError("this node is no longer the leader", code="NO_LEADER", status=503)
    status, data = await svc.submit(cmd, actor=request["role"],
                                    idempotency_key=request_id_header(request.headers, "Idempotency-Key"),
                                    request_id=request_id_header(request.headers, "X-Request-Id"), forward=forward)
    if status == 200 and ok_status != 200:
        status = ok_status
    return respond(data, status)


def expected_version(request: web.Request) -> int | None:
    raw = request.query.get("expected_version")
    if raw is None:
        return None
    try:
        v = int(raw)
    except ValueError:
        raise invalid("expected_version must be an integer", field="expected_version") from None
    if v < 0:
        raise invalid("expected_version must be >= 0", field="expected_version")
    return v
