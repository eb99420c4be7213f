"""TLS for Stator's HTTP: the server's context (certificate and key, and, when client authentication is on, the CA
whose signature a client certificate must bear) and the client's (verify servers against the CA, present a
certificate when the servers require one). Used by meta, broker and the client library alike.

Every class of the client library takes ``ssl_context=`` and then makes, owns and closes its sessions with it. A
``session=`` built with ``client_session`` and lent to a client stays the lender's to close (``async with``): the
client cannot know who else uses it."""

from __future__ import annotations

import asyncio
import socket
import ssl
from dataclasses import dataclass

import aiohttp


class TlsError(ValueError):
    """A certificate, key or CA file that cannot be used; the message names the file."""


@dataclass(frozen=True)
class TlsFiles:
    cert: str | None = None
    key: str | None = None
    ca: str | None = None            # trust: the CA that verifies the servers called (and clients, with client_auth)
    # Whether a server demands client certificates signed by ``ca``. None keeps the behaviour from before the key
    # existed: demanded whenever ``ca`` is given, so configs written then keep meaning what they meant.
    client_auth: bool | None = None

    @property
    def requires_client_cert(self) -> bool:
        return self.client_auth if self.client_auth is not None else self.ca is not None


def _load(what: str, fn, *args) -> None:
    try:
        fn(*args)
    except (OSError, ssl.SSLError) as e:
        raise TlsError(f"{what} {', '.join(a for a in args if a)}: {getattr(e, 'strerror', None) or e}") from None


def server_context(files: TlsFiles) -> ssl.SSLContext:
    if not files.cert or not files.key:
        raise TlsError("a TLS listener needs both cert and key")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load("TLS certificate/key", ctx.load_cert_chain, files.cert, files.key)
    if files.requires_client_cert:
        if not files.ca:
            raise TlsError("client_auth needs ca: the CA that signs the clients' certificates")
        _load("TLS CA", ctx.load_verify_locations, files.ca)
        ctx.verify_mode = ssl.CERT_REQUIRED   # only clients with a certificate the CA signed get in
    return ctx


def without_client_auth(files: TlsFiles) -> TlsFiles:
    """The same certificate, for a listener that asks no client for one (metrics_listen)."""
    return TlsFiles(cert=files.cert, key=files.key, ca=files.ca, client_auth=False)


def client_context(files: TlsFiles) -> ssl.SSLContext:
    """Verify servers against ``files.ca`` (the system's CAs when None); present ``cert``/``key`` when given."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if files.ca:
        _load("TLS CA", ctx.load_verify_locations, files.ca)
    if files.cert or files.key:
        if not (files.cert and files.key):
            raise TlsError("a client certificate needs both cert and key")
        _load("TLS client certificate/key", ctx.load_cert_chain, files.cert, files.key)
    return ctx


CERTIFICATE_REQUEST = 13   # the TLS handshake message type (RFC 8446 4.3.2, RFC 5246 7.4.4)


def client_certificate_required(host: str, port: int, files: TlsFiles, timeout_s: float) -> bool:
    """Whether the server at host:port asked for a client certificate and then gave no answer to a request made
    without one: the cause of a bare "Server disconnected" (TLS 1.3) or "Connection reset" (TLS 1.2), as an asyncio
    server closes such a connection without sending the alert that would say why. Blocking; False when it cannot
    tell (no such server, another failure, an answer)."""
    probe = TlsFiles(ca=files.ca)   # without the client's certificate, whatever it had
    try:
        ctx = client_context(probe)
    except TlsError:
        return False
    asked = []
    # The message callback is CPython's debugging hook (ssl.SSLContext._msg_callback, since 3.8): the only way
    # the ssl module shows which handshake messages arrived. Without it, nothing is claimed.
    if not hasattr(ctx, "_msg_callback"):
        return False
    ctx._msg_callback = lambda _conn, direction, _version, _kind, msg_type, _data: (
        asked.append(True) if direction == "read" and msg_type == CERTIFICATE_REQUEST else None)
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw:
            with ctx.wrap_socket(raw, server_hostname=host) as conn:
                conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: stator\r\nConnection: close\r\n\r\n")
                answered = bool(conn.recv(1))
    except ssl.SSLCertVerificationError:
        return False   # the server's certificate is the problem, and the client's error says so already
    except OSError:
        answered = False
    return bool(asked) and not answered


def speaks_tls(host: str, port: int, timeout_s: float) -> bool:
    """Whether the server at host:port answers a TLS handshake: what a plain http:// request to it ends in is only
    "Server disconnected". Blocking; no certificate is checked (only the protocol is asked); False when it cannot
    tell."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw:
            with ctx.wrap_socket(raw, server_hostname=host):
                return True
    except ssl.SSLError as e:
        # An alert (a client certificate required, a handshake failure) is TLS spoken; an answer that is no TLS
        # record at all (an HTTP server's 400) is WRONG_VERSION_NUMBER or the like
        return "ALERT" in (e.reason or "")
    except OSError:
        return False


class ClosingConnector(aiohttp.TCPConnector):
    """A TCPConnector whose ``close`` leaves no TLS socket open behind it. A TLS connection that a response closes
    (a route watch cancelled by the client's ``close``, say) shuts down gracefully: it sends close_notify and waits
    for the peer's, up to asyncio's 30 s, before its socket is closed. A program that ends first leaves that socket
    unclosed (tests/test_client_sessions.py failed about one run in 30 on a loaded machine with that ResourceWarning,
    the meta node slow to answer). ``close`` aborts every connection this connector made that is still open, as
    aiohttp's own close does with those it still holds (its default ``ssl_shutdown_timeout=0``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Not a WeakSet: uvloop's transports (the servers' loop) take no weak reference. Those whose socket is
        # closed are dropped at each new connection, so this holds the open ones and the few closed since.
        self._made: set[asyncio.BaseTransport] = set()

    async def _wrap_create_connection(self, *args, **kwargs):
        transport, protocol = await super()._wrap_create_connection(*args, **kwargs)
        self._made = {t for t in self._made if _socket_open(t)}
        self._made.add(transport)
        return transport, protocol

    async def close(self, *args, **kwargs) -> None:
        await super().close(*args, **kwargs)
        made, self._made = self._made, set()
        for transport in made:
            if _socket_open(transport):
                transport.abort()
        await asyncio.sleep(0)  # the sockets close at the loop's next pass


def _socket_open(transport: asyncio.BaseTransport) -> bool:
    sock = transport.get_extra_info("socket")
    return sock is not None and sock.fileno() != -1


def connector(ctx: ssl.SSLContext | None) -> aiohttp.TCPConnector | None:
    """A connector using ``ctx`` for https:// URLs (None: aiohttp's default)."""
    return ClosingConnector(ssl=ctx) if ctx is not None else None


def client_session(files: TlsFiles, **kwargs) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=connector(client_context(files)), **kwargs)
