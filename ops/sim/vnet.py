"""A virtual network for asyncio protocols: aiohttp's servers and clients, unchanged, on the simulator's loop.

The brokers, the meta nodes' HTTP API and the chaos workloads all speak HTTP through aiohttp (requests, the SSE
watch, the replica WebSocket). Rather than fake each of them, the simulator runs them over in-memory transports:
``VirtualNet.listen`` registers a protocol factory at ``host:port`` (``VirtualSite``, an aiohttp site), and the
client side's connect goes through ``VirtualLoop.create_connection`` to ``VirtualNet.connect``, which pairs two
``_Transport``s. What a side writes reaches the other side's ``data_received`` after a latency drawn per
connection, in order (TCP's reassembly); a cut link holds its bytes until it heals; ``reset`` ends both sides with
ConnectionResetError; a connect to a port nobody listens on is refused.

aiohttp's client opens its sockets with ``aiohappyeyeballs.start_connection``; ``PATCHES`` (clock.py) swaps that
module for ``happy_eyeballs()``, whose "socket" is only the address, handed to ``create_connection(sock=)``.
Names resolve through ``VirtualLoop.getaddrinfo``: every host is itself, so a URL names a host of the net.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import random
import socket as _socket
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import aiohappyeyeballs
from aiohttp import web

# The host whose code runs now, for the connections it opens: a task inherits it from the context it was created in
# (a broker's tasks, created under its name, connect from its host). Code outside any host connects as "client".
HOST: contextvars.ContextVar[str] = contextvars.ContextVar("sim_host", default="client")


class Life:
    """One incarnation of a process on the net: once ``alive`` is False, nothing scheduled in its context runs again
    (a crash, with no code of its own after it): VirtualLoop holds its callbacks in ``held`` instead, only so that
    the end of a schedule can run them to cancel its tasks (a task whose wake-up was dropped could not be)."""

    def __init__(self) -> None:
        self.alive = True
        self.held: list[tuple[Any, tuple[Any, ...]]] = []


LIFE: contextvars.ContextVar[Life | None] = contextvars.ContextVar("sim_life", default=None)
LATENCY_MIN_S = 0.0001
LATENCY_MAX_S = 0.0005
CONNECT_POLL_S = 0.05      # a connect across a cut link retries this often (the kernel's SYN retries, shortened)


class _Address:
    """What ``happy_eyeballs(net).start_connection`` returns in place of a connected socket."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port


class _Transport(asyncio.Transport):
    """One end of a virtual connection: writes go to ``peer``'s protocol, through the net's delivery queue."""

    def __init__(self, net: VirtualNet, local: tuple[str, int], remote: tuple[str, int]):
        super().__init__()
        self.net, self.local, self.remote = net, local, remote
        self.protocol: asyncio.Protocol | None = None
        self.peer: _Transport | None = None
        self._closing = False
        self._lost = False
        self._paused = False
        self._inbox: collections.deque[bytes | None] = collections.deque()   # None: the peer closed (EOF)
        self._in_flight = 0          # deliveries scheduled and not yet arrived
        self._arrival = 0.0          # the latest arrival scheduled: in-order delivery
        self.rng = random.Random(f"{net.seed}:{local}:{remote}:{net.connections}")

    # -- asyncio.Transport ---------------------------------------------------------------------------------------
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": self.remote, "sockname": self.local}.get(name, default)

    def is_closing(self) -> bool:
        return self._closing

    def write(self, data: Any) -> None:
        if self._closing or not data:
            return
        self.net.send(self, bytes(data))

    def writelines(self, chunks: Any) -> None:
        self.write(b"".join(chunks))

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        self._paused = True

    def resume_reading(self) -> None:
        if self._paused:
            self._paused = False
            self.net.loop.call_soon(self._drain, context=self.net.wire)

    def is_reading(self) -> bool:
        return not self._paused

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self.peer is not None:
            self.net.send(self, None)   # a FIN, after every byte written before it
        self.net.loop.call_soon(self._connection_lost, None, context=self.net.wire)

    def abort(self) -> None:
        self.close()

    # -- delivery --------------------------------------------------------------------------------------------------
    def arrive(self, data: bytes | None) -> None:
        self._in_flight -= 1
        self._inbox.append(data)
        self._drain()

    def _drain(self) -> None:
        while self._inbox and not self._paused and not self._lost:
            data = self._inbox.popleft()
            assert self.protocol is not None
            if data is None:
                self._connection_lost(None)
            else:
                self.protocol.data_received(data)

    def _connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = self._closing = True
        self._inbox.clear()
        if self.protocol is not None:
            self.protocol.connection_lost(exc)


class VirtualNet:
    """The hosts' listeners and the connections between them, on one VirtualLoop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, seed: int):
        self.loop, self.seed = loop, seed
        # Each listener with the context it listens in: its connections' protocols are made and run as its own
        # (vnet.HOST, vnet.LIFE), whoever dials; a crash of its process ends their tasks with it.
        self.listeners: dict[tuple[str, int], tuple[Callable[[], asyncio.Protocol], contextvars.Context]] = {}
        # Bytes on the wire belong to no process: a sender that crashes after writing does not take them back.
        self.wire = contextvars.Context()
        self.cut: set[tuple[str, str]] = set()      # (source host, destination host): bytes held until healed
        self.held: list[tuple[_Transport, bytes | None]] = []
        self.connections = 0
        self._open: list[_Transport] = []

    def blocked(self, src: str, dst: str) -> bool:
        return (src, dst) in self.cut

    # -- servers and clients -----------------------------------------------------------------------------------
    def listen(self, host: str, port: int, factory: Callable[[], asyncio.Protocol]) -> None:
        if (host, port) in self.listeners:
            raise OSError(98, f"address {host}:{port} already in use on the virtual net")
        self.listeners[(host, port)] = (factory, contextvars.copy_context())

    def unlisten(self, host: str, port: int) -> None:
        self.listeners.pop((host, port), None)

    async def connect(self, client_host: str, factory: Callable[[], asyncio.Protocol], host: str, port: int
                      ) -> tuple[_Transport, asyncio.Protocol]:
        while self.blocked(client_host, host) or self.blocked(host, client_host):
            await asyncio.sleep(CONNECT_POLL_S)   # the caller's connect timeout ends it
        listening = self.listeners.get((host, port))
        if listening is None:
            raise ConnectionRefusedError(111, f"connect to {host}:{port}: nothing listens on the virtual net")
        listener, server_context = listening
        self.connections += 1
        local = (client_host, 40000 + self.connections)
        client, server = _Transport(self, local, (host, port)), _Transport(self, (host, port), local)
        client.peer, server.peer = server, client
        await asyncio.sleep(client.rng.uniform(LATENCY_MIN_S, LATENCY_MAX_S))   # the handshake's round trip
        if self.listeners.get((host, port)) is not listening:   # it went away during the handshake
            raise ConnectionRefusedError(111, f"connect to {host}:{port}: nothing listens on the virtual net")
        server.protocol = server_context.run(listener)
        client.protocol = factory()
        self._open += [client, server]
        server_context.run(server.protocol.connection_made, server)
        client.protocol.connection_made(client)
        return client, client.protocol

    def send(self, source: _Transport, data: bytes | None) -> None:
        dest = source.peer
        if dest is None or dest._lost:
            return
        if self.blocked(source.local[0], dest.local[0]):
            self.held.append((source, data))
            return
        now = self.loop.time()
        at = max(source._arrival, now + source.rng.uniform(LATENCY_MIN_S, LATENCY_MAX_S))
        source._arrival = at
        dest._in_flight += 1
        self.loop.call_at(at, dest.arrive, data, context=self.wire)

    def heal(self) -> None:
        """Every cut healed: held bytes go, in the order they were written."""
        self.mend(set(self.cut))

    def mend(self, links: set[tuple[str, str]]) -> None:
        """The cuts of ``links`` (source host, destination host) healed: their held bytes go, in the order they were
        written."""
        self.cut -= links
        held, self.held = self.held, []
        for source, data in held:
            self.send(source, data)   # held again if its link is still cut

    def reset(self, host: str) -> None:
        """Every connection of ``host`` ends at once on both sides (a crash, or the host's link reset)."""
        for t in list(self._open):
            if host in (t.local[0], t.remote[0]):
                t._connection_lost(ConnectionResetError(104, "connection reset on the virtual net"))
        self._open = [t for t in self._open if not t._lost]


class VirtualSite(web.BaseSite):
    """An aiohttp site that listens on the virtual net: ``VirtualSite(runner, net, host, port)``."""

    __slots__ = ("_net", "_host", "_port")

    def __init__(self, runner: web.BaseRunner, net: VirtualNet, host: str, port: int):
        super().__init__(runner)
        self._net, self._host, self._port = net, host, port

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        self._net.listen(self._host, self._port, self._runner.server)
        self._server = SimpleNamespace(close=lambda: self._net.unlisten(self._host, self._port))  # type: ignore[assignment]


class _HappyEyeballs:
    """The stand-in for aiohttp.connector's ``aiohappyeyeballs``: ``start_connection`` returns the address in place
    of a connected socket (the loop's ``create_connection(sock=)`` connects on the net); the rest is the module's."""

    @staticmethod
    async def start_connection(addr_infos: list[Any], **_kw: Any) -> _Address:
        host, port = addr_infos[0][4][:2]
        return _Address(host, port)

    def __getattr__(self, name: str) -> Any:
        return getattr(aiohappyeyeballs, name)


def happy_eyeballs() -> _HappyEyeballs:
    return _HappyEyeballs()


def address_info(host: str, port: int) -> list[tuple[Any, ...]]:
    """``getaddrinfo``'s answer on the virtual net: the host as its own address."""
    return [(_socket.AF_INET, _socket.SOCK_STREAM, _socket.IPPROTO_TCP, "", (host, port))]
