"""TLS for Stator's HTTP: the server's context (certificate, key, and a CA that, when given, makes the server require
client certificates signed by it) and the client's (verify servers against the CA, present a certificate when the
servers require one). Used by meta, broker and the client library alike.

Every class of the client library takes ``ssl_context=`` and then makes, owns and closes its sessions with it. A
``session=`` built with ``client_session`` and lent to a client stays the lender's to close (``async with``): the
client cannot know who else uses it."""

from __future__ import annotations

import ssl
from dataclasses import dataclass

import aiohttp


class TlsError(ValueError):
    """A certificate, key or CA file that cannot be used; the message names the file."""


@dataclass(frozen=True)
class TlsFiles:
    cert: str | None = None
    key: str | None = None
    ca: str | None = None


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
    if files.ca:
        _load("TLS CA", ctx.load_verify_locations, files.ca)
        ctx.verify_mode = ssl.CERT_REQUIRED   # only clients with a certificate the CA signed get in
    return ctx


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


def connector(ctx: ssl.SSLContext | None) -> aiohttp.TCPConnector | None:
    """A connector using ``ctx`` for https:// URLs (None: aiohttp's default)."""
    return aiohttp.TCPConnector(ssl=ctx) if ctx is not None else None


def client_session(files: TlsFiles, **kwargs) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=connector(client_context(files)), **kwargs)
