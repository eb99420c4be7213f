"""TCP forwarders the nemesis can cut: one ``Link`` per listening port, all on the caller's asyncio loop.

A cut link is a black hole, like a pulled cable: its open connections are reset, and a new connection is accepted but
nothing is forwarded and whatever it sends is read and dropped, so the peer learns only by its own timeouts. Healing
closes those held connections (the peer reconnects, as after a real partition) and forwarding starts again.
"""

from __future__ import annotations

import asyncio
import contextlib

CONNECT_TIMEOUT_S = 3.0
CHUNK_BYTES = 64 * 1024
CONNECTIONS_MAX = 256     # per link: a runaway reconnect loop cannot eat the runner's file descriptors


class Link:
    """Forwards 127.0.0.1:``listen_port`` to 127.0.0.1:``target_port`` while not cut."""

    def __init__(self, name: str, listen_port: int, target_port: int):
        self.name = name
        self.listen_port = listen_port
        self.target_port = target_port
        self.cut = False
        self._server: asyncio.AbstractServer | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.listen_port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.listen_port, reuse_address=True)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self._reset_all()   # every pump then ends by itself; a task still connecting upstream ends by its timeout
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=CONNECT_TIMEOUT_S)
        for t in list(self._tasks):
            t.cancel()
        if self._server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), CONNECT_TIMEOUT_S)

    def set_cut(self, cut: bool) -> None:
        """Cut or heal; either way every open connection goes (see the module doc)."""
        self.cut = cut
        self._reset_all()

    def _reset_all(self) -> None:
        for w in list(self._open):
            _abort(w)
        self._open.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if len(self._open) >= CONNECTIONS_MAX:
                _abort(writer)
                return
            self._open.add(writer)
            if self.cut:
                await _drain_until_closed(reader)
            else:
                await self._forward(reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass   # only stop() cancels, and this connection's task ends here anyway
        finally:
            self._open.discard(writer)
            _abort(writer)
            self._tasks.discard(task)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", self.target_port), CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            return   # the target is down: the client sees its connection closed, as with a dead process
        self._open.add(up_writer)
        try:
            # Either direction ending ends both: half-open pairs would outlive a cut.
            pumps = [asyncio.create_task(_pump(reader, up_writer)), asyncio.create_task(_pump(up_reader, writer))]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for p in pumps:
                    p.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            self._open.discard(up_writer)
            _abort(up_writer)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK_BYTES):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass


async def _drain_until_closed(reader: asyncio.StreamReader) -> None:
    # A cut link's connection: read and drop until the peer gives up or the heal aborts it.
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while await reader.read(CHUNK_BYTES):
            pass


def _abort(writer: asyncio.StreamWriter) -> None:
    transport = writer.transport
    if transport is not None and not transport.is_closing():
        transport.abort()
