"""Authentication fails closed (issue 20, item 7): a route whose handler declares no role (neither ``@requires`` nor
``@public``) is refused, at start-up by both services and per request by the shared middleware, never served to a
caller without a token. Served for real on loopback (below the ephemeral port range)."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from runtime.server import error_middleware, public, require_declared_roles, requires
from ops import devcluster

TOKENS = {"admin": "a" * 32, "client": "c" * 32, "broker": None}


async def _undeclared(_request: web.Request) -> web.Response:
    return web.json_response({"secret": "served"})


@requires("client")
async def _client_only(_request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


@public
async def _open(_request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def _app() -> web.Application:
    app = web.Application(middlewares=[error_middleware(lambda _app: TOKENS, "test", lambda *_: None)])
    app.router.add_get("/undeclared", _undeclared)
    app.router.add_get("/client", _client_only)
    app.router.add_get("/open", _open)
    return app


def test_an_app_with_an_undeclared_route_is_refused_at_start_up():
    with pytest.raises(RuntimeError, match=r"GET /undeclared"):
        require_declared_roles(_app(), "test")
    declared = web.Application()
    declared.router.add_get("/client", _client_only)
    declared.router.add_get("/open", _open)
    require_declared_roles(declared, "test")   # every route says who may call it: served


def test_both_services_declare_a_role_on_every_route(tmp_path, monkeypatch):
    from broker.api.app import make_app as make_broker_app
    from broker.config import BrokerConfig
    from meta.api import app as meta_app
    monkeypatch.setattr(meta_app, "MetaService", lambda *a, **kw: None)   # the router only: no node to start
    meta_app.make_app(None)
    make_broker_app(BrokerConfig(broker="x", data_dir=str(tmp_path), http_host="127.0.0.1", http_port=1,
                                 meta_urls=(), token="t", client_token="c"))


async def test_a_request_to_an_undeclared_route_is_refused_whatever_the_token():
    runner = web.AppRunner(_app())
    await runner.setup()
    port = devcluster.free_base_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as session:
            async def get(path: str, token: str | None) -> tuple[int, dict]:
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                async with session.get(f"http://127.0.0.1:{port}{path}", headers=headers) as r:
                    return r.status, await r.json()
            for token in (None, TOKENS["client"], TOKENS["admin"]):
                status, body = await get("/undeclared", token)
                assert (status, body["error"]["code"]) == (403, "PERMISSION_DENIED"), (token, status, body)
            assert (await get("/client", None))[0] == 401
            assert (await get("/client", TOKENS["client"]))[0] == 200
            assert (await get("/open", None))[0] == 200
            status, body = await get("/nowhere", None)   # an unmatched path is still a 404, not an auth error
            assert (status, body["error"]["code"]) == (404, "NOT_FOUND")
    finally:
        await runner.cleanup()
