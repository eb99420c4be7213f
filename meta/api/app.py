"""The meta node's aiohttp application: one factory, the service built and started in a cleanup context, the routes."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from aiohttp import web

from .. import limits
from ..config import MetaConfig
from ..service import MetaService
from . import brokers, cluster, groups, members, topics, watch
from ..console import messages as console_messages
from ..console import pages as console
from ..console import topic_forms as console_topic_forms
from ..admission import Admission
from .keys import ADMISSIONS, METRICS, PARKED_POLLS, PARKED_WATCHES, SERVICE
from .metrics import MetaMetrics
from runtime.server import require_declared_roles
from .middleware import VERSION_HEADER, add_version_header, errors_and_auth, refuse_when_removed
from .parked_polls import ParkedPolls
from .parked_watches import ParkedWatches
from .topic_changes import answer_changes


def make_app(config: MetaConfig, service: Callable[[Admission], MetaService] | None = None) -> web.Application:
    """The meta node's HTTP API. ``service(version_waiters)`` builds its MetaService (default: one that builds and
    starts its own raft node; the simulator's is ``MetaService.around`` its driven node)."""
    app = web.Application(middlewares=[errors_and_auth, refuse_when_removed],
                          client_max_size=limits.REQUEST_BODY_BYTES_MAX)
    metrics = app[METRICS] = MetaMetrics()
    version_waiters = Admission(
        "version_waiters", limits.VERSION_WAITERS_MAX, metrics.version_waiters, metrics.rejections,
        "too many reads wait for a min_version on this node; use another node or retry")
    app[ADMISSIONS] = {
        "long_polls": Admission("long_poll_waiters", limits.LONG_POLL_WAITERS_MAX, metrics.long_polls,
                                metrics.rejections, "too many long polls wait on this node; use another node or SSE"),
        "watch_streams": Admission("watch_streams", limits.WATCH_STREAMS_MAX, metrics.watch_streams,
                                   metrics.rejections, "too many watch streams on this node"),
    }

    async def service_ctx(app: web.Application):
        # Built as the app starts, not with the app: the node binds its raft port as it is built, after the HTTP
        # port (runtime/serve.py), and its parts belong to the running loop (meta/service.py).
        svc = app[SERVICE] = (service or functools.partial(MetaService, config))(version_waiters)
        polls = app[PARKED_POLLS] = ParkedPolls(svc.reads, svc.feed, VERSION_HEADER,
                                                metrics.long_polls_answered_parked)
        watches = app[PARKED_WATCHES] = ParkedWatches(svc.reads, svc.feed, metrics.watch_events_written_parked,
                                                      metrics.watch_streams_parked)
        await svc.start()
        answering = asyncio.create_task(answer_changes(svc.feed, [polls, watches]), name="parked-answers")
        tending = asyncio.create_task(watches.tend(), name="parked-watches-tend")
        metrics.watch_node(svc)
        try:
            yield
        finally:
            answering.cancel()
            tending.cancel()
            await asyncio.gather(answering, tending, return_exceptions=True)
            polls.close()
            watches.close()
            await svc.stop()

    app.cleanup_ctx.append(service_ctx)
    app.on_response_prepare.append(add_version_header)
    for module in (topics, brokers, groups, watch, cluster, members, console, console_messages,
                   console_topic_forms):
        module.add_routes(app)
    require_declared_roles(app, "meta node")
    return app
