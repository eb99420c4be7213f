"""Stator's raft transport: pysyncobj's messages over authenticated, encrypted, batched links (wire_format.py).

Plugged in through pysyncobj's public ``transportClass``: ``SyncObj(..., transportClass=functools.partial(
StatorTransport, RaftLink(secret=...)))``. It replaces pysyncobj's TCPTransport, which unpickles whatever reaches
its port (remote code execution for anyone who can connect, before any password check) and pickles, compresses and
Fernet-encrypts every message one by one (most of the CPU of a write).

How it runs: every socket is non-blocking and registered with pysyncobj's own poller (``syncObj._poller``), so every
callback here runs on the tick, inside the tick's ``poll``. Nothing here is thread-safe, nor needs to be.

- ``send(node, message)`` only queues the message for ``node`` (if its link is up) and returns whether it is.
- ``flush()`` turns each node's queued messages into one sealed frame (several only past FRAME_BYTES_MAX), appends
  it to the link's write buffer and writes at once; the poller watches for writability only while bytes remain.
  Just before framing, ``set_before_flush``'s callback gets every queued message (group commit: the journal is
  synced once before the acknowledgements it covers leave).
- The transport flushes on its own (a) at the end of its tick callback (registered in __init__, so it runs before
  callbacks the application registers later), and (b) right after it dispatched the messages of a read, so that a
  follower's acknowledgement leaves in the same poll that brought the entries, not a tick later. The application
  calls ``flush()`` at the end of each phase of its tick that sends (a no-op when nothing is queued).
- Received frames are opened (authenticated) and decoded, and each message goes to pysyncobj's handler in order.
  An exception from that handler propagates into the tick, as with TCPTransport; the rest of that frame is lost
  (Raft resends).

Connections: one per pair of nodes; the node whose raft address sorts higher connects (every
``conf.connectionRetryTime``), the other accepts; a new authenticated connection from a node replaces its old one
(the peer restarted). A link is up (``onNodeConnected``) only once the peer's AUTH opened; it goes down
(``onNodeDisconnected``, once) on EOF, a socket error, a frame that fails authentication or decoding,
``conf.connectionTimeout`` without a whole frame received, a write buffer past WRITE_BUFFER_BYTES_MAX, or a frame
counter at its end. Whole frames, not bytes: a length prefix damaged in flight (it is authenticated only with the
frame it announces) made the reader wait for a megabyte that never came while keepalives kept the bytes flowing,
and the link stayed up one way for good (the simulator, seed 5185: a flipped bit turned 80 bytes into 1,048,656).
Every node sends each peer a keepalive every half second, and no frame is larger than one entry and a snapshot
chunk, so a healthy link completes a frame well within the timeout. Refusals are logged once per (peer host, reason)
and counted in ``refused``.

Not supported (pysyncobj features TCPTransport has): read-only nodes (``selfNode`` None) and pysyncobj's utility
messages (``syncobj_admin``: status, add, remove, set_version, transfer over the raft port); ``conf.password``,
``sendBufferSize``, ``recvBufferSize`` and ``tcp_keepalive`` are not used (the kernel sizes the buffers; the idle
timeout and the application's keepalives find dead links).

Mutual TLS: when the link has TLS contexts (the node's ``tls`` with a ``ca``: ``RaftLink.with_tls``), every
connection first completes a TLS handshake in which both sides present a certificate the cluster's CA signed (the
dialing side also checks the peer's certificate names the host it dialed); the HELLO/AUTH handshake and the sealed
frames then run inside it, unchanged. A node without TLS and a node with it never link (refused as ``tls``).
"""

from __future__ import annotations

import errno
import functools
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.node import Node, TCPNode
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.transport import Transport, TransportNotReadyError

from . import wire_format as wire
from .housekeeping import Housekeeping
from .wire_format import Kind, Reason, WireError

log = structlog.get_logger("meta.raft.transport")

HANDSHAKE_TIMEOUT_S = 5.0                      # from accept (or dial) to the peer's AUTH opened
UNAUTHENTICATED_CONNECTIONS_MAX = 32           # incoming connections still in their handshake; more: the newest closes
WRITE_BUFFER_BYTES_MAX = 256 * 1024 * 1024     # a peer this far behind is closed: pysyncobj resends after a reconnect
RECV_CHUNK_BYTES = 256 * 1024                  # one recv_into; one scratch buffer per transport
READ_BYTES_PER_EVENT_MAX = 16 * 1024 * 1024    # then back to the poller, so one busy link cannot hold the tick
ACCEPTS_PER_EVENT_MAX = 64
LISTEN_BACKLOG = 64
REFUSAL_LOG_KEYS_MAX = 1024                    # (peer host, reason) pairs logged once each; then only counted

_READ = POLL_EVENT_TYPE.READ
_WRITE = POLL_EVENT_TYPE.WRITE
_ERROR = POLL_EVENT_TYPE.ERROR


@dataclass(frozen=True)
class RaftLink:
    """What the transport needs from the node's config: the cluster secret every node shares, and the TLS contexts
    when the raft port speaks mutual TLS (both or neither)."""
    secret: str = field(repr=False)
    server_tls: ssl.SSLContext | None = field(default=None, repr=False)   # accepted connections
    client_tls: ssl.SSLContext | None = field(default=None, repr=False)   # dialed connections

    def __post_init__(self) -> None:
        if not isinstance(self.secret, str) or not self.secret:
            raise ValueError("RaftLink needs the cluster secret, a non-empty string")
        if (self.server_tls is None) != (self.client_tls is None):
            raise ValueError("RaftLink's TLS needs both contexts: the raft port accepts and dials")
        for ctx in (self.server_tls, self.client_tls):
            if ctx is not None and ctx.verify_mode != ssl.CERT_REQUIRED:
                raise ValueError("the raft port's TLS is mutual: both contexts must require the peer's certificate")

    @classmethod
    def with_tls(cls, secret: str, cert: str, key: str, ca: str) -> RaftLink:
        """Mutual TLS under the cluster's CA: this node's certificate both ways, peers' verified against ``ca``."""
        from wire.tls import TlsFiles, client_context, server_context
        files = TlsFiles(cert=cert, key=key, ca=ca)
        return cls(secret=secret, server_tls=server_context(files), client_tls=client_context(files))

    @property
    def tls(self) -> bool:
        return self.server_tls is not None

    @property
    def master_key(self) -> bytes:
        """The stretched secret (~0.2 s the first time in a process; wire_format caches it)."""
        return wire.stretch_secret(self.secret)


class _State:
    CONNECTING = 0      # outgoing TCP connect in progress
    TLS = 5             # TLS handshake in progress (a link with TLS only)
    HELLO = 1           # waiting for the peer's HELLO (or REFUSE)
    AUTH = 2            # keys derived, waiting for the peer's AUTH
    OPEN = 3
    CLOSED = 4


class _Conn:
    __slots__ = ("sock", "fd", "outgoing", "node", "peer", "state", "reader", "wbuf", "mask", "callback",
                 "started", "last_frame", "hello", "session", "claimed")

    def __init__(self, sock: socket.socket, outgoing: bool, node: Node | None, peer: str, state: int, now: float):
        self.sock = sock
        self.fd = sock.fileno()
        self.outgoing = outgoing
        self.node = node          # outgoing: the node dialed; incoming: the node its HELLO names, once known
        self.peer = peer          # for logs: the node's address (outgoing) or the remote IP (incoming)
        self.state = state
        self.reader = wire.FrameReader()
        self.wbuf = bytearray()
        self.mask = 0
        self.callback: Callable[[int, int], None] | None = None
        self.started = now
        self.last_frame = now     # the last whole frame received (or the connection's start)
        self.hello = b""          # our HELLO body
        self.session: wire.Session | None = None
        self.claimed = ""         # the address the peer's HELLO names (its own; outgoing: maybe not the one dialed)


class StatorTransport(Transport):
    """pysyncobj transport: ``functools.partial(StatorTransport, RaftLink(secret=...))`` as ``transportClass``."""

    def __init__(self, link: RaftLink, syncObj: Any, selfNode: Node | None, otherNodes: Any):
        super().__init__(syncObj, selfNode, otherNodes)
        if selfNode is None:
            raise ValueError("StatorTransport does not support read-only nodes (selfNode None)")
        wire.encode_hello(bytes(wire.HELLO_NONCE_BYTES), selfNode.address)   # ValueError now, not at every handshake
        self._conf = syncObj.conf
        self._poller = syncObj._poller
        self._self = selfNode
        self._key = link.master_key
        self._link = link
        self._log = log.bind(node=selfNode.address)     # several nodes may share a process (tests, benches)
        self._nodes: dict[str, Node] = {}                  # raft address -> node
        self._links: dict[Node, _Conn] = {}                # authenticated links only
        self._dialing: dict[Node, _Conn] = {}              # our outgoing connections still in their handshake
        self._incoming: dict[_Conn, None] = {}             # accepted connections still in their handshake (an
                                                           # ordered set: handled in the order they came)
        self._last_dial: dict[Node, float] = {}
        self._pending: dict[Node, list[dict[str, Any]]] = {}
        self._outgoing: Callable[[Any], Any] | None = None   # set_outgoing
        self._before_flush: Callable[[list[dict[str, Any]]], None] | None = None
        self._sent: Callable[[list[dict[str, Any]]], None] | None = None
        self._server: socket.socket | None = None
        self._ready = False
        self._destroyed = False
        self._bind_attempts = 0
        self._last_bind_attempt = float("-inf")
        self.housekeeping = Housekeeping()   # dials and expiries: not at every tick (housekeeping.py)
        self._bind_over = threading.Event()
        self._scratch = bytearray(RECV_CHUNK_BYTES)
        self._scratch_view = memoryview(self._scratch)
        self._noted: set[tuple[str, str]] = set()
        self._noted_full = False
        # Metrics, read from any thread: plain ints, and a dict to copy (dict(refused)) before iterating it.
        self.frames_sent = 0
        self.frames_received = 0
        self.bytes_sent = 0
        self.bytes_received = 0
        self.refused: dict[str, int] = {}
        # Off for a node that flushes at a point of its own tick (MetaSyncObj._batch_appends): this tick callback
        # runs before the node's others, and flushing here sent a forwarded command's answer in one frame and the
        # entries that carry it in a second one, a second read and open on the follower's path.
        self.flush_on_tick = True
        for node in otherNodes:
            self.addNode(node)
        syncObj.addOnTickCallback(self._onTick)

    # -- pysyncobj's Transport API -----------------------------------------------------------------------------
    def tryGetReady(self) -> None:
        """Bind the raft port unless bound; raises TransportNotReadyError after conf.maxBindRetries failures."""
        self._maybe_bind()

    @property
    def ready(self) -> bool:
        return self._ready

    def waitReady(self) -> None:
        """From another thread than the tick's: until bound, or TransportNotReadyError once binding gave up."""
        self._bind_over.wait()
        if not self._ready:
            raise TransportNotReadyError

    def addNode(self, node: Node) -> None:
        if not isinstance(node, TCPNode):
            raise TypeError(f"StatorTransport needs TCPNode addresses, not {type(node).__name__}")
        self._nodes[node.address] = node

    def dropNode(self, node: Node) -> None:
        """Forget the node: its connections close (onNodeDisconnected if its link was up) and are not redialed."""
        self._nodes.pop(getattr(node, "address", None), None)
        for conn in [c for c in (self._links.get(node), self._dialing.get(node)) if c is not None]:
            self._close(conn, "dropped")
        for conn in [c for c in self._incoming if c.node == node]:
            self._close(conn, "dropped")
        self._pending.pop(node, None)
        self._last_dial.pop(node, None)

    def set_outgoing(self, rewrite: Callable[[Any], Any] | None) -> None:
        """``rewrite(message)``: what to send instead of each message queued from now on (meta/raft/prevote.py
        marks a leadership transfer's vote requests)."""
        self._outgoing = rewrite

    def send(self, node: Node, message: dict[str, Any]) -> bool:
        """Queue ``message`` for the next flush; False (and nothing queued) when the node's link is not up.
        The message is encoded at the flush: it must not change in between (pysyncobj never changes one)."""
        if node not in self._links:
            return False
        if self._outgoing is not None:
            message = self._outgoing(message)
        queued = self._pending.get(node)
        if queued is None:
            self._pending[node] = [message]
        else:
            queued.append(message)
        return True

    def destroy(self) -> None:
        """Close every connection and the listening socket, unsubscribe them all; no callback fires any more."""
        self._destroyed = True
        self.setOnMessageReceivedCallback(None)
        self.setOnNodeConnectedCallback(None)
        self.setOnNodeDisconnectedCallback(None)
        self.setOnReadonlyNodeConnectedCallback(None)
        self.setOnReadonlyNodeDisconnectedCallback(None)
        for conn in [*self._links.values(), *self._dialing.values(), *self._incoming]:
            self._close(conn, "destroyed")
        self._pending.clear()
        if self._server is not None:
            self._poller.unsubscribe(self._server.fileno())
            self._server.close()
            self._server = None
        self._bind_over.set()

    # -- batching ------------------------------------------------------------------------------------------------
    def set_before_flush(self, callback: Callable[[list[dict[str, Any]]], None] | None,
                         sent: Callable[[list[dict[str, Any]]], None] | None = None) -> None:
        """``callback(messages)`` runs once per flush that has messages, with every queued message (all nodes), on
        the tick, before any is framed. If it raises, those messages are dropped (Raft resends them) and
        the exception propagates to the caller of flush. ``sent(messages)`` runs with each node's messages once
        they are written to its link (what left, checked when it left: group commit's acknowledgement check)."""
        self._before_flush = callback
        self._sent = sent

    def flush(self) -> None:
        """Frame, seal and write every queued message: one frame per node (several only past FRAME_BYTES_MAX)."""
        pending = self._pending
        if not pending:
            return
        self._pending = {}
        if self._before_flush is not None:
            self._before_flush([message for messages in pending.values() for message in messages])
        for node, messages in pending.items():
            conn = self._links.get(node)
            if conn is not None:       # else the link went down since send(): pysyncobj resends after a reconnect
                self._send_messages(conn, messages)
                if self._sent is not None:
                    self._sent(messages)

    def _send_messages(self, conn: _Conn, messages: list[dict[str, Any]]) -> None:
        try:
            batches, too_large = wire.pack_batches(messages)
        except (TypeError, ValueError, OverflowError) as e:
            # A message carrying something other than plain data: a bug of the sender, never silently dropped.
            types = sorted({str(m.get("type")) for m in messages})
            self._log.error("raft_message_unencodable", peer=conn.peer, types=types, error=str(e))
            return
        for message in too_large:
            self._log.error("raft_message_too_large", peer=conn.peer, type=str(message.get("type")),
                            frame_bytes_max=wire.FRAME_BYTES_MAX)
        assert conn.session is not None
        try:
            for batch in batches:
                head, sealed = conn.session.seal(Kind.MESSAGES, batch)
                conn.wbuf += head
                conn.wbuf += sealed
                self.frames_sent += 1
        except wire.CounterExhausted:
            self._close(conn, Reason.COUNTER_EXHAUSTED)
            return
        self._write(conn)

    # -- tick ----------------------------------------------------------------------------------------------------
    def _onTick(self) -> None:
        if self._destroyed:
            return
        try:
            self._maybe_bind()
        except TransportNotReadyError:
            pass
        if not self._ready:
            return
        now = time.monotonic()
        if self.housekeeping.due(now):
            self._dial_missing(now)
            self._expire(now)
        if self.flush_on_tick:
            self.flush()

    def _maybe_bind(self) -> None:
        if self._ready or self._destroyed:
            return
        now = time.monotonic()
        if now < self._last_bind_attempt + self._conf.bindRetryTime:
            return
        self._last_bind_attempt = now
        try:
            self._bind()
        except OSError as e:
            self._bind_attempts += 1
            self._log.warning("raft_bind_failed", address=self._self.address, error=str(e), attempt=self._bind_attempts)
            if self._conf.maxBindRetries and self._bind_attempts >= self._conf.maxBindRetries:
                self._bind_over.set()
                raise TransportNotReadyError from e
        else:
            self._ready = True
            self._bind_over.set()

    def _bind(self) -> None:
        # The node's own host, not 0.0.0.0: the raft port need not be reachable from every network the host has.
        address = self._conf.bindAddress or self._self.address
        host, port = address.rsplit(":", 1)
        ip = globalDnsResolver().resolve(host.strip("[]"))
        if ip is None:
            raise OSError(f"cannot resolve {host!r}")
        sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setblocking(False)
            sock.bind((ip, int(port)))
            sock.listen(LISTEN_BACKLOG)
        except OSError:
            sock.close()
            raise
        self._server = sock
        self._poller.subscribe(sock.fileno(), self._on_accept, _READ | _ERROR)

    def _dial_missing(self, now: float) -> None:
        retry = self._conf.connectionRetryTime
        for node in list(self._nodes.values()):
            if (self._self.address > node.address and node not in self._links and node not in self._dialing
                    and now - self._last_dial.get(node, float("-inf")) >= retry):
                self._last_dial[node] = now
                self._dial(node, now)

    def _dial(self, node: TCPNode, now: float) -> None:
        ip = node.ip
        if ip is None:
            self._unreachable(node.address, "unresolved")
            return
        sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        code = sock.connect_ex((ip, node.port))
        if code not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EINTR):
            sock.close()
            self._unreachable(node.address, errno.errorcode.get(code, str(code)))
            return
        conn = _Conn(sock, True, node, node.address, _State.CONNECTING, now)
        self._dialing[node] = conn
        self._watch(conn, _WRITE | _ERROR)

    def _expire(self, now: float) -> None:
        idle_max = self._conf.connectionTimeout
        for conn in list(self._links.values()):
            if now - conn.last_frame > idle_max:
                self._close(conn, "timeout")
        for conn in [*self._dialing.values(), *self._incoming]:
            if now - conn.started > HANDSHAKE_TIMEOUT_S:
                self._refuse(conn, Reason.HANDSHAKE_TIMEOUT)

    # -- sockets -------------------------------------------------------------------------------------------------
    def _on_accept(self, fd: int, event: int) -> None:
        server = self._server
        if server is None or fd != server.fileno():
            return
        now = time.monotonic()
        for _ in range(ACCEPTS_PER_EVENT_MAX):
            try:
                sock, addr = server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:    # EMFILE and friends: the backlog keeps the connection; the next tick retries
                self._note("raft_accept_failed", "*", errno.errorcode.get(e.errno or 0, str(e)))
                return
            peer = str(addr[0])
            if len(self._incoming) >= UNAUTHENTICATED_CONNECTIONS_MAX:
                sock.close()
                self._count_refusal(peer, Reason.TOO_MANY_UNAUTHENTICATED, limit=UNAUTHENTICATED_CONNECTIONS_MAX)
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            tls = self._link.server_tls
            if tls is not None:
                sock = tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            conn = _Conn(sock, False, None, peer, _State.TLS if tls is not None else _State.HELLO, now)
            self._incoming[conn] = None
            self._watch(conn, _READ | _ERROR)

    def _watch(self, conn: _Conn, mask: int) -> None:
        conn.callback = functools.partial(self._on_event, conn)
        conn.mask = mask
        self._poller.subscribe(conn.fd, conn.callback, mask)

    def _on_event(self, conn: _Conn, fd: int, event: int) -> None:
        # pysyncobj's poller may deliver an event computed before this connection closed (its fd possibly reused):
        # every path below tolerates a spurious event.
        if conn.state == _State.CLOSED or fd != conn.fd:
            return
        if conn.state == _State.CONNECTING:
            if event & (_WRITE | _ERROR):
                self._on_dialed(conn)
            return
        if conn.state == _State.TLS:
            self._tls_handshake(conn)
            return
        if event & _ERROR:
            if conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self._close(conn, "socket_error")
                return
            event |= _READ          # a hang-up: the read finds the end of stream
        if event & _WRITE:
            self._write(conn)
        if event & _READ and conn.state != _State.CLOSED:
            self._read(conn)

    def _on_dialed(self, conn: _Conn) -> None:
        code = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            self._close(conn, "connect_failed")
            self._unreachable(conn.peer, errno.errorcode.get(code, str(code)))
            return
        try:
            conn.sock.getpeername()
        except OSError:
            return          # a spurious event (an fd reused within one poll): the connect is still in progress
        tls = self._link.client_tls
        if tls is not None:
            assert conn.node is not None
            conn.sock = tls.wrap_socket(conn.sock, server_hostname=conn.node.host,
                                        do_handshake_on_connect=False)
            conn.state = _State.TLS
            self._tls_handshake(conn)
            return
        self._send_hello(conn)

    def _send_hello(self, conn: _Conn) -> None:
        conn.state = _State.HELLO
        conn.hello = wire.encode_hello(os.urandom(wire.HELLO_NONCE_BYTES), self._self.address)
        conn.wbuf += wire.frame(conn.hello)
        self.frames_sent += 1
        self._write(conn)

    def _tls_handshake(self, conn: _Conn) -> None:
        """One step of the TLS handshake; once done, the dialing side sends its HELLO (the other waits for it)."""
        sock = conn.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._set_mask(conn, _READ | _ERROR)
            return
        except ssl.SSLWantWriteError:
            self._set_mask(conn, _READ | _WRITE | _ERROR)
            return
        except (ssl.SSLError, ssl.CertificateError, OSError) as e:
            detail = getattr(e, "verify_message", None) or getattr(e, "reason", None) or type(e).__name__
            if conn.outgoing:
                self._unreachable(conn.peer, f"tls: {detail}")
            self._refuse(conn, Reason.TLS, str(detail))
            return
        conn.last_frame = time.monotonic()
        if conn.outgoing:
            self._send_hello(conn)
        else:
            conn.state = _State.HELLO
            self._set_mask(conn, _READ | _ERROR)
            if sock.pending():
                self._read(conn)   # the peer's HELLO came with the handshake's last flight

    def _set_mask(self, conn: _Conn, mask: int) -> None:
        if mask != conn.mask:
            conn.mask = mask
            self._poller.subscribe(conn.fd, conn.callback, mask)

    def _write(self, conn: _Conn) -> None:
        wbuf = conn.wbuf
        while wbuf:
            try:
                sent = conn.sock.send(wbuf)
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                break
            except OSError:
                self._close(conn, "socket_error")
                return
            del wbuf[:sent]
            self.bytes_sent += sent
        if len(wbuf) > WRITE_BUFFER_BYTES_MAX:
            self._close(conn, "write_buffer_full")
            return
        self._set_mask(conn, _READ | _ERROR | (_WRITE if wbuf else 0))

    def _read(self, conn: _Conn) -> None:
        budget = READ_BYTES_PER_EVENT_MAX
        dispatched = False
        while budget > 0:
            try:
                got = conn.sock.recv_into(self._scratch)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except OSError:
                self._close(conn, "socket_error")
                break
            if got == 0:
                if conn.outgoing and conn.state != _State.OPEN:
                    self._unreachable(conn.peer, "closed_during_handshake")
                self._close(conn, "eof")
                break
            budget -= got
            self.bytes_received += got
            conn.reader.feed(self._scratch_view[:got])
            dispatched |= self._frames(conn)
            if conn.state == _State.CLOSED or (got < RECV_CHUNK_BYTES and not _tls_pending(conn.sock)):
                # A short read: the socket is (almost surely) drained, spare the EAGAIN round trip. TLS hands out
                # one record per read and may hold more already decrypted, which no poll would announce.
                break
        if dispatched:
            self.flush()    # the acknowledgements those messages caused leave now, not at the next tick

    def _frames(self, conn: _Conn) -> bool:
        """Handle every complete frame buffered; True if messages went to pysyncobj."""
        dispatched = False
        while conn.state != _State.CLOSED:
            limit = wire.FRAME_BYTES_MAX if conn.state == _State.OPEN else wire.HANDSHAKE_FRAME_BYTES_MAX
            try:
                body = conn.reader.next(limit)
                if body is None:
                    break
                self.frames_received += 1
                conn.last_frame = time.monotonic()
                if conn.state == _State.OPEN:
                    dispatched |= self._on_messages(conn, body)
                elif conn.state == _State.HELLO:
                    self._on_hello(conn, body)
                else:
                    self._on_auth(conn, body)
            except WireError as e:
                # Named to a peer that is still in its handshake with us: a node with another secret then logs
                # that we refused its AUTH instead of only seeing the connection close.
                named = conn.state == _State.AUTH and not conn.outgoing
                self._refuse(conn, e.reason, e.detail, wire.encode_refusal(e.reason) if named else None, **e.fields)
        return dispatched

    # -- handshake -----------------------------------------------------------------------------------------------
    def _on_hello(self, conn: _Conn, body: bytes) -> None:
        try:
            hello = wire.parse_handshake(body)
        except WireError as e:
            if e.reason != Reason.WIRE_VERSION:
                raise
            # Refused by name, so that the connecting side logs both versions too (it has no one to tell).
            reply = None if conn.outgoing else wire.encode_refusal(e.reason)
            self._refuse(conn, e.reason, f"peer {conn.peer} {e.detail}", reply, **e.fields)
            return
        if isinstance(hello, wire.Refusal):
            self._on_refusal(conn, hello)
        elif conn.outgoing:
            self._on_server_hello(conn, body, hello)
        else:
            self._on_client_hello(conn, body, hello)

    def _on_refusal(self, conn: _Conn, refusal: wire.Refusal) -> None:
        if not conn.outgoing:
            raise WireError(Reason.MALFORMED_HELLO, "a REFUSE from the connecting side")
        if refusal.version != wire.WIRE_VERSION:
            self._refuse(conn, Reason.WIRE_VERSION, f"peer {conn.peer} speaks raft wire version {refusal.version}, "
                         f"this node {wire.WIRE_VERSION}", peer_version=refusal.version,
                         wire_version=wire.WIRE_VERSION)
        else:
            self._refuse(conn, Reason.REFUSED_BY_PEER, f"peer {conn.peer} refused this node: {refusal.reason}",
                         peer_reason=refusal.reason)

    def _on_client_hello(self, conn: _Conn, body: bytes, hello: wire.Hello) -> None:
        node = self._nodes.get(hello.address)
        if node is None:
            self._refuse(conn, Reason.UNKNOWN_NODE, f"claims to be {hello.address[:100]!r}",
                         wire.encode_refusal(Reason.UNKNOWN_NODE))
            return
        if hello.address <= self._self.address:
            # That node accepts our connection; a second connection per pair would be a second ordering of messages.
            self._refuse(conn, Reason.WRONG_DIRECTION, f"{hello.address} must accept from {self._self.address}",
                         wire.encode_refusal(Reason.WRONG_DIRECTION))
            return
        conn.node = node
        conn.hello = wire.encode_hello(os.urandom(wire.HELLO_NONCE_BYTES), self._self.address)
        conn.session = wire.Session(self._key, body, conn.hello, is_client=False)
        conn.state = _State.AUTH
        conn.wbuf += wire.frame(conn.hello)
        self.frames_sent += 1
        self._write(conn)

    def _on_server_hello(self, conn: _Conn, body: bytes, hello: wire.Hello) -> None:
        assert conn.node is not None
        # The answering node's own address may differ from the one dialed (a proxy or NAT in between, as the chaos
        # runner's topology has): the link is the node this side dialed, and the AUTH under the cluster secret
        # proves the peer is a member. Its address stays in the transcript the keys are bound to.
        conn.claimed = hello.address
        conn.session = wire.Session(self._key, conn.hello, body, is_client=True)
        conn.state = _State.AUTH
        self._send_auth(conn)

    def _send_auth(self, conn: _Conn) -> None:
        assert conn.session is not None
        head, sealed = conn.session.seal(Kind.AUTH, self._self.address.encode())
        conn.wbuf += head
        conn.wbuf += sealed
        self.frames_sent += 1
        self._write(conn)

    def _on_auth(self, conn: _Conn, body: bytes) -> None:
        assert conn.session is not None and conn.node is not None
        if conn.outgoing and body.startswith(wire.MAGIC):   # sealed frames start with their kind byte, never 'S'
            refusal = wire.parse_handshake(body)
            if not isinstance(refusal, wire.Refusal):
                raise WireError(Reason.PROTOCOL_VIOLATION, "a second HELLO")
            self._on_refusal(conn, refusal)
            return
        kind, plaintext = conn.session.open(body)
        if kind != Kind.AUTH:
            raise WireError(Reason.PROTOCOL_VIOLATION, f"a {kind.name} frame before AUTH")
        claimed = conn.claimed if conn.outgoing else conn.node.address
        if plaintext != claimed.encode():
            raise WireError(Reason.AUTH_MISMATCH, f"HELLO from {claimed}, AUTH from {plaintext[:100]!r}")
        if self._nodes.get(conn.node.address) is not conn.node:
            raise WireError(Reason.UNKNOWN_NODE, f"{conn.node.address} was dropped during the handshake")
        if not conn.outgoing:
            self._send_auth(conn)   # only now: a peer without the secret never sees a sealed frame of ours
            if conn.state == _State.CLOSED:
                return
        self._open(conn)

    def _open(self, conn: _Conn) -> None:
        node = conn.node
        assert node is not None
        old = self._links.get(node)
        if old is not None:
            self._close(old, "replaced")
        self._incoming.pop(conn, None)
        if self._dialing.get(node) is conn:
            del self._dialing[node]
        conn.state = _State.OPEN
        conn.last_frame = time.monotonic()
        self._links[node] = conn
        self._log.info("raft_peer_connected", peer=node.address, outgoing=conn.outgoing)
        self._onNodeConnected(node)

    # -- messages ------------------------------------------------------------------------------------------------
    def _on_messages(self, conn: _Conn, body: bytes) -> bool:
        assert conn.session is not None and conn.node is not None
        kind, plaintext = conn.session.open(body)
        if kind != Kind.MESSAGES:
            raise WireError(Reason.PROTOCOL_VIOLATION, f"a {kind.name} frame after AUTH")
        messages = wire.decode_messages(plaintext)
        node = conn.node
        for message in messages:
            self._onMessageReceived(node, message)
            if conn.state == _State.CLOSED:   # the handler dropped the node or destroyed the transport
                break
        return bool(messages)

    # -- endings -------------------------------------------------------------------------------------------------
    def _refuse(self, conn: _Conn, reason: str, detail: str = "", reply: bytes | None = None, **fields: Any) -> None:
        """Close ``conn`` for ``reason``: counted, logged once per (peer host, reason); ``reply`` (a REFUSE body)
        is written first, best effort: the connection closes either way."""
        self._count_refusal(self._host(conn), reason, detail=detail, **fields)
        if reply is not None and conn.state != _State.CLOSED:
            conn.wbuf += wire.frame(reply)
            self.frames_sent += 1
            self._write(conn)
        self._close(conn, reason)

    def _count_refusal(self, host: str, reason: str, **fields: Any) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        self._note("raft_peer_refused", host, reason, **{k: v for k, v in fields.items() if v != ""})

    def _unreachable(self, peer: str, reason: str) -> None:
        self._note("raft_peer_unreachable", peer.rsplit(":", 1)[0], reason, address=peer)

    def _note(self, event: str, host: str, reason: str, **fields: Any) -> None:
        """One warning per (peer host, reason), the first time only: garbage from the network cannot flood the log.
        Past REFUSAL_LOG_KEYS_MAX pairs nothing new is remembered nor logged (counters still count)."""
        key = (host, reason)
        if key in self._noted:
            return
        if len(self._noted) >= REFUSAL_LOG_KEYS_MAX:
            if not self._noted_full:
                self._noted_full = True
                self._log.warning("raft_refusal_log_full", remembered=REFUSAL_LOG_KEYS_MAX)
            return
        self._noted.add(key)
        self._log.warning(event, peer=host, reason=reason, **fields)

    @staticmethod
    def _host(conn: _Conn) -> str:
        return conn.peer.rsplit(":", 1)[0] if conn.outgoing else conn.peer

    def _close(self, conn: _Conn, reason: str) -> None:
        if conn.state == _State.CLOSED:
            return
        was_open = conn.state == _State.OPEN
        conn.state = _State.CLOSED
        self._poller.unsubscribe(conn.fd)
        try:
            conn.sock.close()
        except OSError:
            pass
        # pysyncobj's PollPoller keeps the callback (and so this object) until the fd is reused: drop the buffers.
        conn.wbuf = bytearray()
        conn.reader = wire.FrameReader()
        conn.session = None
        self._incoming.pop(conn, None)
        node = conn.node
        if node is not None:
            if self._dialing.get(node) is conn:
                del self._dialing[node]
            if self._links.get(node) is conn:
                del self._links[node]
                self._pending.pop(node, None)
        if was_open and node is not None:
            self._log.info("raft_peer_disconnected", peer=node.address, reason=reason)
            self._onNodeDisconnected(node)


def _tls_pending(sock: socket.socket) -> int:
    return sock.pending() if isinstance(sock, ssl.SSLSocket) else 0
