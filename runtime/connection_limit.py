"""A bound on a server's open HTTP connections, for meta and broker alike.

aiohttp accepts every connection the listen backlog hands it; each holds a socket, buffers and a handler task, so a
flood of idle connections (or a client leaking them) grows a node until it falls over. The limit counts connections
as the server opens and closes them. A connection that arrives when ``limit`` are already open is still served, but
only with a refusal: each of its requests is answered 503 TOO_MANY_CONNECTIONS (API.md's error shape, counted in the
service's refusals metric) and the connection is closed after the answer. Connections opened earlier are never
affected, so a node at its limit keeps serving the clients it already has.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from wire.errors import ApiError

HTTP_CONNECTIONS_MAX_DEFAULT = 10_000
HTTP_CONNECTIONS_LIMIT_MAX = 1_000_000   # the config's bound on the setting


class ConnectionLimit:
    def __init__(self, limit: int):
        self.limit = limit
        self._open: set[Any] = set()       # the server's connection handlers, open now
        self._over: set[Any] = set()       # those that arrived past the limit

    def attach(self, server: web.Server) -> None:
        """Count ``server``'s connections (call once its runner is set up, before the site starts)."""
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: Any, transport: Any) -> None:
            if len(self._open) >= self.limit:
                self._over.add(handler)
            self._open.add(handler)
            made(handler, transport)

        def connection_lost(handler: Any, exc: BaseException | None = None) -> None:
            self._open.discard(handler)
            self._over.discard(handler)
            lost(handler, exc)

        server.connection_made = connection_made      # type: ignore[method-assign]
        server.connection_lost = connection_lost      # type: ignore[method-assign]

    @property
    def open(self) -> int:
        return len(self._open)

    def check(self, request: web.Request) -> None:
        """Raises the refusal for a request that came on a connection past the limit."""
        if self._over and request.protocol in self._over:
            raise ApiError(f"this node already holds {self.limit} connections; retry later or use another node",
                           code="TOO_MANY_CONNECTIONS", status=503, details={"limit": self.limit})


CONNECTION_LIMIT = web.AppKey("connection_limit", ConnectionLimit)
