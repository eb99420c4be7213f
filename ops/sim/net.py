"""Simulated TCP under Stator's raft transport: sockets, a poller per node, and the network between the nodes.

Each direction of a connection is a FIFO (``_Pipe``): a chunk arrives at ``max(previous arrival, now + latency)``.
A blocked direction (a partition, one-way or not) holds its chunks, a FIN included, until it heals; a chunk that
reaches a closed socket on a host that is up answers with a reset. A dial whose SYN cannot pass is retried every
SYN_RETRY_S, as the kernel does, until the transport's own handshake timeout closes it. Every random draw of a
connection comes from its own generator keyed by (seed, source, destination, connection number), so that the order
in which the transport walks its sets (hashed by id()) cannot shift the draws of another connection.
"""

from __future__ import annotations

import bisect
import errno
import random
import socket as _socket
from collections import deque
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from pysyncobj.poller import POLL_EVENT_TYPE

READ, WRITE, ERROR = POLL_EVENT_TYPE.READ, POLL_EVENT_TYPE.WRITE, POLL_EVENT_TYPE.ERROR
LATENCY_MIN_S = 0.0001
LATENCY_MAX_S = 0.0005
LATENCY_SPIKE_P = 0.01
LATENCY_SPIKE_MAX_S = 0.05
SYN_RETRY_S = 1.0
SYN_RETRIES_MAX = 6
FD_FIRST = 1000
EPHEMERAL_PORT_FIRST = 40000

_EOF = b""          # a FIN in a pipe
_RST = None         # a reset in a pipe


class _Pipe:
    """One direction of one connection: numbered chunks, delivered in order (TCP's reassembly); a chunk that meets
    a cut on its way is held and sent again once the cut heals."""

    def __init__(self, net: SimNet, src: SimSocket, dst: SimSocket, rng: random.Random):
        self.net, self.src, self.dst, self.rng = net, src, dst, rng
        self.last_arrival = 0.0
        self.sent = 0
        self.next_seq = 0
        self.held: list[tuple[int, bytes | None]] = []
        self.early: dict[int, bytes | None] = {}
        self.corrupt_next = False                # flip one bit of the next chunk (the AEAD must refuse it)
        self.departing: dict[int, float] = {}    # chunks written in a step under way: they leave when it ends
        self.void: set[int] = set()              # ... unless the process died first

    def put(self, item: bytes | None) -> None:
        if item and self.corrupt_next:
            self.corrupt_next = False
            at = self.rng.randrange(len(item))
            item = item[:at] + bytes([item[at] ^ (1 << self.rng.randrange(8))]) + item[at + 1:]
        seq, self.sent = self.sent, self.sent + 1
        now = self.net.loop.time()
        departure = max(now, self.net.busy_until(self.src.owner))
        if self.departing:
            self.departing = {s: d for s, d in self.departing.items() if d > now}
        if departure > now:
            self.departing[seq] = departure
        if self.held or self.net.blocked(self.src.owner, self.dst.owner):
            self.held.append((seq, item))
            return
        self._schedule(seq, item)

    def void_after(self, t: float) -> None:
        """The sender died at ``t``: what its step had not sent by then never leaves."""
        self.void |= {s for s, d in self.departing.items() if d > t}

    def _schedule(self, seq: int, item: bytes | None) -> None:
        net = self.net
        departure = max(net.loop.time(), self.departing.get(seq, 0.0))
        arrival = max(self.last_arrival, departure + net.latency(self.rng, self.src.owner, self.dst.owner))
        self.last_arrival = arrival
        net.loop.call_at(arrival, self._arrive, seq, item)

    def release(self) -> None:
        while self.held and not self.net.blocked(self.src.owner, self.dst.owner):
            self._schedule(*self.held.pop(0))

    def _arrive(self, seq: int, item: bytes | None) -> None:
        if self.net.blocked(self.src.owner, self.dst.owner):   # cut while in flight: sent again after the heal
            bisect.insort(self.held, (seq, item), key=lambda h: h[0])
            return
        self.early[seq] = item
        while self.next_seq in self.early:
            item = self.early.pop(self.next_seq)
            if self.next_seq not in self.void:
                self._deliver(item)
            self.next_seq += 1

    def _deliver(self, item: bytes | None) -> None:
        dst = self.dst
        self.net.trace("net", self.src.owner, dst.owner, item if item else b"")
        if dst.state == "closed":
            if item and dst.owner_incarnation_alive():
                reverse = dst.pipe
                if reverse is not None:
                    reverse.put(_RST)
            return
        if item is _RST:
            dst.error = errno.ECONNRESET
            dst.reset = True
        elif item == _EOF:
            dst.eof = True
        else:
            dst.inbox.append(item)
        self.net.wake(dst.owner)


class SimSocket:
    def __init__(self, net: SimNet, owner: str, incarnation: int):
        self.net, self.owner, self.incarnation = net, owner, incarnation
        self.fd = net.next_fd()
        self.state = "new"
        self.local: tuple[str, int] | None = None
        self.remote: tuple[str, int] | None = None
        self.pipe: _Pipe | None = None          # our outgoing direction
        self.inbox: deque[bytes] = deque()
        self.backlog: deque[SimSocket] = deque()
        self.eof = False
        self.reset = False
        self.error = 0
        net.sockets[self.fd] = self

    def owner_incarnation_alive(self) -> bool:
        return self.net.host_up(self.owner)

    # -- the socket API the transport uses ---------------------------------------------------------------------
    def fileno(self) -> int:
        return self.fd

    def setblocking(self, flag: bool) -> None:
        pass

    def setsockopt(self, *args: Any) -> None:
        pass

    def bind(self, address: tuple[str, int]) -> None:
        if address in self.net.listeners:
            raise OSError(errno.EADDRINUSE, "address in use")
        self.local = (address[0], int(address[1]))

    def listen(self, backlog: int) -> None:
        assert self.local is not None
        self.state = "listening"
        self.net.listeners[self.local] = self

    def accept(self) -> tuple[SimSocket, tuple[str, int]]:
        if self.state != "listening" or not self.backlog:
            raise BlockingIOError(errno.EAGAIN, "no connection")
        sock = self.backlog.popleft()
        assert sock.remote is not None
        return sock, sock.remote

    def connect_ex(self, address: tuple[str, int]) -> int:
        self.state = "connecting"
        self.remote = (address[0], int(address[1]))
        self.local = (self.net.ip_of(self.owner), self.net.next_port())
        self.net.syn(self, 0)
        return errno.EINPROGRESS

    def getsockopt(self, level: int, option: int) -> int:
        code, self.error = self.error, 0
        return code

    def getpeername(self) -> tuple[str, int]:
        if self.state != "connected":
            raise OSError(errno.ENOTCONN, "not connected")
        assert self.remote is not None
        return self.remote

    def send(self, data: Any) -> int:
        if self.reset:
            raise ConnectionResetError(errno.ECONNRESET, "reset")
        if self.state != "connected" or self.pipe is None:
            raise OSError(errno.EPIPE, "not connected")
        chunk = bytes(data)
        if chunk:
            self.pipe.put(chunk)
        return len(chunk)

    def recv_into(self, buffer: Any) -> int:
        if self.reset:
            raise ConnectionResetError(errno.ECONNRESET, "reset")
        if self.inbox:
            chunk = self.inbox.popleft()
            n = min(len(chunk), len(buffer))
            buffer[:n] = chunk[:n]
            if n < len(chunk):
                self.inbox.appendleft(chunk[n:])
            return n
        if self.eof:
            return 0
        raise BlockingIOError(errno.EAGAIN, "nothing to read")

    def close(self) -> None:
        self._close(fin=True)

    def _close(self, fin: bool) -> None:
        if self.state == "closed":
            return
        if self.state == "listening" and self.net.listeners.get(self.local) is self:  # type: ignore[arg-type]
            del self.net.listeners[self.local]  # type: ignore[arg-type]
        if fin and self.state == "connected" and self.pipe is not None and not self.reset:
            self.pipe.put(_EOF)
        self.state = "closed"
        self.inbox.clear()
        self.net.sockets.pop(self.fd, None)

    def events(self) -> int:
        s = self.state
        if s == "listening":
            return READ if self.backlog else 0
        if s == "connecting":
            return WRITE | ERROR if self.error else 0
        if s == "connected":
            ev = WRITE
            if self.inbox or self.eof or self.reset:
                ev |= READ
            if self.reset:
                ev |= ERROR
            return ev
        return 0


class SimPoller:
    """pysyncobj's Poller for one node: ``poll`` never blocks; it dispatches the ready fds in subscription order."""

    def __init__(self, net: SimNet):
        self.net = net
        self._subs: dict[int, tuple[Callable[[int, int], None], int]] = {}

    def subscribe(self, descr: int, callback: Callable[[int, int], None], eventMask: int) -> None:
        self._subs[descr] = (callback, eventMask)

    def unsubscribe(self, descr: int) -> None:
        self._subs.pop(descr, None)

    def poll(self, timeout: float) -> None:
        ready = []
        for fd, (callback, mask) in self._subs.items():
            sock = self.net.sockets.get(fd)
            if sock is not None:
                ev = sock.events() & (mask | ERROR)
                if ev:
                    ready.append((fd, callback, ev))
        for fd, callback, ev in ready:
            if self._subs.get(fd, (None,))[0] is callback:
                callback(fd, ev)


class SimNet:
    """The network of one schedule: addresses, listeners, partitions, slow nodes."""

    def __init__(self, sim: Any, seed: int, addresses: dict[str, str]):
        self.sim, self.loop, self.seed = sim, sim.loop, seed
        self.addresses = addresses                       # node name -> "ip:port"
        self._ip_to_node = {a.rsplit(":", 1)[0]: n for n, a in addresses.items()}
        self.sockets: dict[int, SimSocket] = {}
        self.listeners: dict[tuple[str, int], SimSocket] = {}
        self.cut: set[tuple[str, str]] = set()            # blocked directions (source node, destination node)
        self.slow: dict[str, float] = {}                  # node -> extra latency each way, seconds
        self.down: set[str] = set()                       # machines off (power loss until restart)
        self._pipes: list[_Pipe] = []
        self._conn_seq: dict[tuple[str, str], int] = {}
        self._fd = FD_FIRST
        self._port = EPHEMERAL_PORT_FIRST
        self.socket_module = SimpleNamespace(
            socket=self._new_socket, AF_INET=_socket.AF_INET, AF_INET6=_socket.AF_INET6,
            SOCK_STREAM=_socket.SOCK_STREAM, SOL_SOCKET=_socket.SOL_SOCKET, SO_REUSEADDR=_socket.SO_REUSEADDR,
            IPPROTO_TCP=_socket.IPPROTO_TCP, TCP_NODELAY=_socket.TCP_NODELAY, SO_ERROR=_socket.SO_ERROR)

    def _new_socket(self, family: int = _socket.AF_INET, kind: int = _socket.SOCK_STREAM) -> SimSocket:
        owner = self.sim.clocks.current
        assert owner is not None, "a socket opened outside any node's step"
        return SimSocket(self, owner, self.sim.nodes[owner].incarnation)

    def next_fd(self) -> int:
        self._fd += 1
        return self._fd

    def next_port(self) -> int:
        self._port += 1
        return self._port

    def ip_of(self, node: str) -> str:
        return self.addresses[node].rsplit(":", 1)[0]

    def busy_until(self, node: str) -> float:
        return self.sim.nodes[node].busy_until

    def host_up(self, node: str) -> bool:
        return node not in self.down

    def blocked(self, src: str, dst: str) -> bool:
        return (src, dst) in self.cut

    def trace(self, kind: str, src: str, dst: str, data: bytes) -> None:
        self.sim.trace(kind, src, dst, data)

    def wake(self, node: str) -> None:
        self.sim.wake(node)

    def latency(self, rng: random.Random, src: str, dst: str) -> float:
        d = rng.uniform(LATENCY_MIN_S, LATENCY_MAX_S)
        if rng.random() < LATENCY_SPIKE_P:
            d += rng.uniform(0, LATENCY_SPIKE_MAX_S)
        return d + self.slow.get(src, 0.0) + self.slow.get(dst, 0.0)

    def _rng(self, src: str, dst: str) -> random.Random:
        n = self._conn_seq.get((src, dst), 0) + 1
        self._conn_seq[(src, dst)] = n
        return random.Random(f"{self.seed}:{src}>{dst}:{n}")

    # -- connecting --------------------------------------------------------------------------------------------
    def syn(self, client: SimSocket, attempt: int) -> None:
        assert client.remote is not None
        target = self._ip_to_node.get(client.remote[0])
        rng = self._rng(client.owner, target or "?")
        delay = self.latency(rng, client.owner, target or client.owner)
        self.loop.call_at(self.loop.time() + delay, self._syn_arrives, client, target, attempt, rng)

    def _syn_arrives(self, client: SimSocket, target: str | None, attempt: int, rng: random.Random) -> None:
        if client.state != "connecting":
            return
        passes = target is not None and not self.blocked(client.owner, target) and not self.blocked(target, client.owner)
        if not passes or target in self.down:
            if attempt + 1 < SYN_RETRIES_MAX:
                self.loop.call_at(self.loop.time() + SYN_RETRY_S * (2 ** attempt), self._retry, client, attempt + 1)
            else:
                client.error = errno.ETIMEDOUT
                self.wake(client.owner)
            return
        assert client.remote is not None
        listener = self.listeners.get(client.remote)
        if listener is None:
            client.error = errno.ECONNREFUSED
            self.wake(client.owner)
            return
        server = SimSocket(self, target, self.sim.nodes[target].incarnation)
        server.state = "connected"
        server.local, server.remote = client.remote, client.local
        client.pipe = _Pipe(self, client, server, rng)
        server.pipe = _Pipe(self, server, client, self._rng(target, client.owner))
        self._pipes += [client.pipe, server.pipe]
        listener.backlog.append(server)
        self.wake(target)
        # the SYN-ACK's way back
        self.loop.call_at(self.loop.time() + self.latency(rng, target, client.owner), self._established, client)

    def _retry(self, client: SimSocket, attempt: int) -> None:
        if client.state == "connecting":
            self.syn(client, attempt)

    def _established(self, client: SimSocket) -> None:
        if client.state == "connecting":
            client.state = "connected"
            self.wake(client.owner)

    # -- faults ------------------------------------------------------------------------------------------------
    def heal(self) -> None:
        self.cut.clear()
        self.release()

    def release(self) -> None:
        live = []
        for pipe in self._pipes:
            pipe.release()
            if pipe.held or pipe.src.state != "closed" or pipe.dst.state != "closed":
                live.append(pipe)
        self._pipes = live

    def kill(self, node: str, power: bool) -> None:
        """The node's process is gone: the kernel closes its sockets (a FIN each), unless the machine lost power;
        what its step under way had not sent yet never leaves."""
        now = self.loop.time()
        for pipe in self._pipes:
            if pipe.src.owner == node:
                pipe.void_after(now)
        for sock in [s for s in self.sockets.values() if s.owner == node]:
            sock._close(fin=not power)
        if power:
            self.down.add(node)

    def corrupt_link(self, a: str, b: str) -> None:
        """The next chunk from ``a`` to ``b`` on each of their connections has one bit flipped."""
        for pipe in self._pipes:
            if pipe.src.owner == a and pipe.dst.owner == b and pipe.src.state == "connected":
                pipe.corrupt_next = True

    def reset_link(self, a: str, b: str) -> None:
        for sock in list(self.sockets.values()):
            if sock.state == "connected" and sock.pipe is not None and {sock.owner, sock.pipe.dst.owner} == {a, b}:
                sock.reset, sock.error = True, errno.ECONNRESET
                self.wake(sock.owner)
