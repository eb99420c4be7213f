"""A keep-alive HTTP/1.1 GET client of one connection, for benchmarks whose clients share the cores they measure.

``fanout``'s thousand long-poll subscribers run in client processes on the same two cores as the three nodes.
Through aiohttp's client an answer (a 2.6 KB route) costs them ~85 µs of CPU, ~85 ms a round, more than the three
nodes spend serving it (~12 ms each). Through this client it costs ~45 µs, of which ~25 are the route's JSON parse.
A subscriber on another machine costs the nodes nothing; this one keeps the clients' share of the figure small.

It speaks only what a JSON GET needs: one request at a time, a status line, headers, and a body framed by
Content-Length (no chunked encoding, no compression: it sends no Accept-Encoding). Anything else is a
``LeanHttpError``, never a guess. Every wait has the caller's timeout.
"""

from __future__ import annotations

import asyncio

HEADERS_BYTES_MAX = 64 * 1024
BODY_BYTES_MAX = 64 * 1024 * 1024


class LeanHttpError(Exception):
    pass


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future | None = None
        self.head: tuple[int, int] | None = None   # (status, body length) of the answer being read
        self.closed: Exception | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.waiter is not None and not self.waiter.done():
            self._try_answer()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = exc or LeanHttpError("connection closed by the server")
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(self.closed)

    def _try_answer(self) -> None:
        try:
            if self.head is None:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.buf) > HEADERS_BYTES_MAX:
                        raise LeanHttpError(f"headers over {HEADERS_BYTES_MAX} bytes")
                    return
                self.head = _parse_head(bytes(self.buf[:end]))
                del self.buf[:end + 4]
            status, length = self.head
            if len(self.buf) < length:
                return
            body = bytes(self.buf[:length])
            del self.buf[:length]
            self.head = None
            self.waiter.set_result((status, body))
        except LeanHttpError as e:
            self.waiter.set_exception(e)
            self.transport.close()


def _parse_head(head: bytes) -> tuple[int, int]:
    lines = head.split(b"\r\n")
    if not lines[0].startswith(b"HTTP/1.1 ") or len(lines[0]) < 12:
        raise LeanHttpError(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
    status = int(lines[0][9:12])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" or name == b"content-encoding":
            raise LeanHttpError(f"{name.decode()} {value.strip().decode()!r} is not spoken here")
    if not 0 <= length <= BODY_BYTES_MAX:
        raise LeanHttpError(f"body of {length} bytes")
    return status, length


class LeanConnection:
    """One connection; ``get`` sends a request and returns (status, body). Not for concurrent use."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol, host: str, port: int, headers: dict[str, str]):
        self._transport = transport
        self._protocol = protocol
        self._fixed = (f"Host: {host}:{port}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
                       + "\r\n").encode()

    @classmethod
    async def open(cls, host: str, port: int, headers: dict[str, str], timeout_s: float) -> "LeanConnection":
        loop = asyncio.get_running_loop()
        transport, protocol = await asyncio.wait_for(loop.create_connection(_Protocol, host, port), timeout_s)
        return cls(transport, protocol, host, port, headers)

    async def get(self, path_and_query: str, timeout_s: float) -> tuple[int, bytes]:
        p = self._protocol
        if p.closed is not None or self._transport.is_closing():
            raise LeanHttpError(f"connection closed: {p.closed or 'by this side'}")
        loop = asyncio.get_running_loop()
        p.waiter = loop.create_future()
        timer = loop.call_later(timeout_s, _expire, p.waiter, timeout_s)
        try:
            self._transport.write(b"GET " + path_and_query.encode() + b" HTTP/1.1\r\n" + self._fixed)
            if p.buf:
                p._try_answer()
            return await p.waiter
        finally:
            timer.cancel()
            p.waiter = None

    def close(self) -> None:
        self._transport.close()


def _expire(fut: asyncio.Future, timeout_s: float) -> None:
    if not fut.done():
        fut.set_exception(asyncio.TimeoutError(f"no answer in {timeout_s} s"))
