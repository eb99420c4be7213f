"""The HTTP server shell of a node, meta or broker: its listening sockets, TLS, the connection limit, the
metrics listener, and running until SIGTERM/SIGINT (meta/serve.py and broker/serve.py start their own node)."""

from __future__ import annotations

import asyncio
import signal
import socket
from typing import Any

from aiohttp import web

from runtime.connection_limit import HTTP_CONNECTIONS_MAX_DEFAULT

HTTP_BACKLOG = 2048
HTTP_SHUTDOWN_TIMEOUT_S = 2.0
HTTP_REQUEST_LINE_BYTES_MAX = 256 * 1024   # 1,000 topic names of 127 characters, with room
HTTP_HEADER_BYTES_MAX = 64 * 1024


class StartupError(RuntimeError):
    """The node cannot start where its config says (an address in use, a host that does not resolve).

    The message is one line that names the address."""


def listening_socket(host: str, port: int, label: str) -> socket.socket:
    """A TCP socket bound to host:port and listening, or a StartupError that starts with ``label``."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise StartupError(f"{label}: cannot resolve {host!r}: {e.strerror}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # SO_REUSEADDR: a port left in TIME_WAIT by this node's previous run is free to use; a listener is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(HTTP_BACKLOG)
    except OSError as e:
        sock.close()
        raise StartupError(f"{label} is not available: {e.strerror}") from None
    return sock


async def serve_app(app: web.Application, host: str, port: int, tls: Any = None,
                    connections_max: int = HTTP_CONNECTIONS_MAX_DEFAULT, metrics: Any = None) -> None:
    """``tls``: the config's TlsFiles (wire/tls.py) to serve HTTPS, None for plain HTTP. ``connections_max``: open
    connections beyond it are answered 503 TOO_MANY_CONNECTIONS (runtime/connection_limit.py). ``metrics``: the
    config's MetricsListener (runtime/config_file.py), a second listener for the scrape and health paths only."""
    from wire.tls import server_context, without_client_auth
    ssl_context = server_context(tls) if tls is not None else None   # a bad file fails here, before the port
    metrics_ssl = server_context(without_client_auth(tls)) if metrics is not None and metrics.tls else None
    # The HTTP port is taken before the app starts (and so before a meta node joins Raft): a port in use fails at
    # once with its address, and nothing else can take the port while the app starts. Requests that arrive
    # meanwhile wait in the listen backlog instead of being refused.
    sock = listening_socket(host, port, f"HTTP address {host}:{port}")
    try:
        metrics_sock = listening_socket(metrics.host, metrics.port, f"metrics address {metrics.host}:{metrics.port}") \
            if metrics is not None else None
    except StartupError:
        sock.close()
        raise
    if metrics_sock is not None:
        app.middlewares.insert(0, only_scrape_paths_on(metrics.port))   # outermost: before any token is asked for
    open_files_for(connections_max)
    runner = app_runner(app, connections_max)
    try:
        await set_up(runner)
        await web.SockSite(runner, sock, backlog=HTTP_BACKLOG, ssl_context=ssl_context).start()
        if metrics_sock is not None:
            await web.SockSite(runner, metrics_sock, backlog=HTTP_BACKLOG, ssl_context=metrics_ssl).start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
        sock.close()
        if metrics_sock is not None:
            metrics_sock.close()


def app_runner(app: web.Application, connections_max: int = HTTP_CONNECTIONS_MAX_DEFAULT) -> web.AppRunner:
    """The runner every node serves its app with (the simulator too, on its virtual net): set it up with set_up."""
    from runtime.connection_limit import CONNECTION_LIMIT, ConnectionLimit
    app[CONNECTION_LIMIT] = ConnectionLimit(connections_max)   # before setup: the app is frozen there
    # handler_cancellation: a long poll or watch whose client went away stops at once instead of holding its
    # waiter slot until its wait ends.
    # The request line and header bounds are raised from aiohttp's 8,190 bytes: a watch of the 1,000 topics allowed
    # per stream needs a long query, and an over-long request id should reach the app and get its coded 400.
    return web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=HTTP_SHUTDOWN_TIMEOUT_S,
                         handler_cancellation=True, max_line_size=HTTP_REQUEST_LINE_BYTES_MAX,
                         max_field_size=HTTP_HEADER_BYTES_MAX)


async def set_up(runner: web.AppRunner) -> None:
    """The app started (its cleanup contexts entered), its connection limit attached to the server."""
    from runtime.connection_limit import CONNECTION_LIMIT
    await runner.setup()
    runner.app[CONNECTION_LIMIT].attach(runner.server)


SCRAPE_PATHS = frozenset({"/metrics", "/healthz", "/readyz"})


def only_scrape_paths_on(metrics_port: int):
    """A middleware that answers 404 NOT_FOUND to anything but a GET of the scrape and health paths arriving on the
    metrics listener: that listener asks for no client certificate, so the API must not be reachable through it.
    Both listeners share one app (one meta node, one set of metrics); the local port tells them apart, as the
    Host header is the caller's to choose."""
    from wire.errors import ApiError
    from runtime.server import error_response

    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:
        local = request.transport.get_extra_info("sockname") if request.transport is not None else None
        on_metrics = local is None or local[1] == metrics_port   # a connection gone: refuse rather than guess
        if on_metrics and not (request.method in ("GET", "HEAD") and request.path in SCRAPE_PATHS):
            return error_response(ApiError(f"{request.method} {request.path}: the metrics listener serves "
                                           f"{', '.join(sorted(SCRAPE_PATHS))} only", code="NOT_FOUND", status=404))
        return await handler(request)

    return middleware


OPEN_FILES_RESERVE = 1_024   # descriptors beyond the HTTP connections: segment files, raft links, outgoing calls


def open_files_for(connections_max: int) -> int:
    """Raises the soft open-file limit toward ``connections_max`` plus a reserve (up to the hard limit) and returns
    it. Below the connection bound, accept() fails with EMFILE first: new clients then wait unanswered in the backlog
    instead of getting their 503 TOO_MANY_CONNECTIONS, so a limit that stays too low is logged."""
    import resource

    import structlog
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = connections_max + OPEN_FILES_RESERVE
    if soft != resource.RLIM_INFINITY and soft < want:
        soft = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft != resource.RLIM_INFINITY and soft < want:
        structlog.get_logger("serve").warning("open_files_limit_below_connections", open_files=soft,
                                              http_connections_max=connections_max, wanted=want)
    return soft


def start_power_loss_ledger(data_dir: str) -> None:
    """The test-only power-loss mode (runtime/power_loss.py), on before any durable file is opened; logged loudly."""
    import structlog

    from runtime import power_loss
    ledger = power_loss.enable(data_dir)
    structlog.get_logger("serve").warning("unsafe_power_loss_ledger_on", ledger=ledger.path)
