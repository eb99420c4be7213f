"""The meta node's aiohttp application: one factory, the service as a cleanup context, the routes."""

from __future__ import annotations

from aiohttp import web

from .. import limits
from ..config import MetaConfig
from ..service import MetaService
from . import brokers, cluster, topics, watch
from .keys import METRICS, SERVICE
from .metrics import MetaMetrics
from .middleware import add_version_header, errors_and_auth


def make_app(config: MetaConfig) -> web.Application:
    app = web.Application(middlewares=[errors_and_auth], client_max_size=limits.REQUEST_BODY_BYTES_MAX)
    app[SERVICE] = MetaService(config)
    app[METRICS] = MetaMetrics()

    async def service_ctx(app: web.Application):
        await app[SERVICE].start()
        yield
        await app[SERVICE].stop()

    app.cleanup_ctx.append(service_ctx)
    app.on_response_prepare.append(add_version_header)
    for module in (topics, brokers, watch, cluster):
        module.add_routes(app)
    return app
