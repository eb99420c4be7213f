"""The admin CLI's global options (API.md, "Admin CLI"): where the cluster is, who we are, how to print.

They are accepted anywhere on the command line, as etcdctl's are: ``GlobalOptionsGroup`` moves the ones given before
a subcommand's name to after it, so the command that runs parses them whatever their place. Every admin command is
an ``admin_command``: it gets the resolved ``Globals`` and runs as one coroutine whose errors become one line
(``error: CODE: message``, exit status 1).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import signal
import ssl
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp
import click
from click.core import ParameterSource

from wire.caller import TLS_DISCONNECT_HINT
from wire.errors import INVALID_ARGUMENT, UNAUTHENTICATED, UNAVAILABLE, StatorError, Unavailable
from wire.tls import TlsError, TlsFiles, client_certificate_required, client_context, speaks_tls

from wire.times import parse_iso
from . import output

if TYPE_CHECKING:
    from client import AdminClient

DEFAULT_ENDPOINT = "http://127.0.0.1:7100"
ENDPOINTS_MAX = 16              # a meta cluster has at most 7 members; more is a mistake on the command line
TOKEN_FILE_BYTES_MAX = 4096     # a token is at most 1,024 characters (runtime/config_file.py SECRET_CHARS_MAX)
WRITE_OUT = ("table", "json")
# Options taking a value, as they may appear before a subcommand ("-w" also glued: "-wjson").
_VALUED = frozenset({"--endpoints", "--token", "--token-file", "-w", "--write-out", "--dir", "--cacert", "--cert",
                     "--key"})


class CliError(Exception):
    """A problem found before (or instead of) asking the cluster; printed like an API error."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def _hoist(args: list[str]) -> list[str]:
    """``args`` with the global options that precede the subcommand's name moved after it (before any ``--``)."""
    front: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a.split("=", 1)[0] in _VALUED:
            n = 1 if "=" in a else 2
            front += args[i:i + n]
            i += n
        elif a.startswith("-w") and not a.startswith("--") and len(a) > 2:
            front.append(a)
            i += 1
        else:
            break
    rest = args[i:]
    if not front or not rest:
        return args
    if "--" in rest:
        k = rest.index("--")
        return rest[:k] + front + rest[k:]
    return rest + front


class GlobalOptionsGroup(click.Group):
    """A group that lets the admin CLI's global options stand before its subcommand's name. ``lazy``: subcommands
    imported only when named (``"module:attribute"``): a server started as ``stator meta serve`` then never imports
    the admin commands, the client library or rich (a tenth of its start-up CPU), nor does ``stator topic list``
    import the chaos runner."""

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, _hoist(list(args)))

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy and name not in self.commands:
            module, attribute = self.lazy[name].split(":")
            self.add_command(getattr(importlib.import_module(module), attribute), name)
        return super().get_command(ctx, name)


@dataclass(frozen=True)
class Globals:
    endpoints: list[str]
    token: str | None
    output: str
    ssl_context: ssl.SSLContext | None = None   # https:// endpoints with our own CA or a client certificate
    consistency: str = "linearizable"            # of reads (--consistency): each CLI call is a new client

    @property
    def json(self) -> bool:
        return self.output == "json"

    def admin(self, **kwargs: Any) -> AdminClient:
        """An AdminClient for the endpoints, with the token, TLS settings and the reads' consistency."""
        from client import AdminClient
        kwargs.setdefault("consistency", self.consistency)
        return AdminClient(self.endpoints, self.need_token(), ssl_context=self.ssl_context, **kwargs)

    def need_token(self) -> str:
        if not self.token:
            raise CliError(UNAUTHENTICATED, "no token: give --token, --token-file or --dir, or set STATOR_TOKEN")
        return self.token


async def emit_listing(g: Globals, key: str, read: Callable[[AdminClient], Awaitable[list[Any]]],
                       columns: Sequence[output.Column]) -> None:
    """A listing command's work: ``{key: rows}`` from one admin call, printed as a table of ``columns`` (or as that
    JSON document)."""
    async with g.admin() as admin:
        data = {key: await read(admin)}
    output.emit(g.json, data, lambda d: output.table(d[key], columns))


def read_token_file(path: str) -> str:
    """The token in ``path``. Like ssh with a private key, a file that group or others may read is refused: the
    token would already be out of the operator's hands."""
    from runtime.config_file import ConfigError, check_private
    try:
        check_private(path)
    except ConfigError as e:
        raise CliError(INVALID_ARGUMENT, f"token file {e}") from None
    try:
        with open(path, "rb") as f:
            raw = f.read(TOKEN_FILE_BYTES_MAX + 1)
    except OSError as e:
        raise CliError(INVALID_ARGUMENT, f"token file {path}: {e.strerror}") from None
    if len(raw) > TOKEN_FILE_BYTES_MAX:
        raise CliError(INVALID_ARGUMENT, f"token file {path}: longer than {TOKEN_FILE_BYTES_MAX} bytes")
    token = raw.decode("utf-8", "replace").strip()
    if not token:
        raise CliError(INVALID_ARGUMENT, f"token file {path}: empty")
    return token


def _dev_cluster(dir_: str) -> tuple[list[str], str]:
    from ops import devcluster
    try:
        info = devcluster.load(dir_)
        return [m["url"] for m in info["meta"]], info["admin_token"]
    except OSError as e:
        raise CliError(INVALID_ARGUMENT, f"--dir {dir_}: cannot read cluster.json: {e.strerror}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise CliError(INVALID_ARGUMENT, f"--dir {dir_}: cluster.json is not a `stator dev` cluster's: {e}") from None


def endpoint_list(raw: str) -> list[str]:
    urls = [u.strip().rstrip("/") for u in raw.split(",") if u.strip()]
    if not urls or len(urls) > ENDPOINTS_MAX:
        raise CliError(INVALID_ARGUMENT, f"--endpoints needs 1 to {ENDPOINTS_MAX} URLs, comma-separated")
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad:
        raise CliError(INVALID_ARGUMENT, f"--endpoints: {bad[0]!r} is not an http:// or https:// URL")
    return urls


def _tls(cacert: str | None, cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if not (cacert or cert or key):
        return None
    try:
        return client_context(TlsFiles(cert=cert, key=key, ca=cacert))
    except TlsError as e:
        raise CliError(INVALID_ARGUMENT, str(e)) from None


def resolve(ctx: click.Context, endpoints: str | None, token: str | None, token_file: str | None,
            write_out: str, dir_: str | None, tls: tuple[str | None, str | None, str | None] = (None, None, None),
            consistency: str = "linearizable") -> Globals:
    """The command line wins, then ``--dir``, then the environment, then the default."""
    def from_command_line(name: str) -> bool:
        return ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE

    if from_command_line("token") and token_file:
        raise click.UsageError("give --token or --token-file, not both")
    dev_urls, dev_token = _dev_cluster(dir_) if dir_ else (None, None)
    if endpoints and (from_command_line("endpoints") or dev_urls is None):
        urls = endpoint_list(endpoints)
    else:
        urls = dev_urls or [DEFAULT_ENDPOINT]
    if token_file:
        token = read_token_file(token_file)
    elif token and (from_command_line("token") or dev_token is None):
        token = token.strip()
    else:
        token = dev_token
    return Globals(urls, token or None, write_out, _tls(*tls), consistency)


def take_interrupts() -> None:
    """Let SIGINT end this process even when it was started with SIGINT ignored.

    A shell without job control (a script's ``cmd &``, ``nohup``, CI runners, a test suite run in the background)
    starts its children with SIGINT ignored, and Python then leaves it ignored: asyncio.run installs its handler only
    over the default one. A stream that ends only when interrupted (``route --watch``, ``history --follow``) then
    never ends on ``kill -INT``: ``route --watch`` under a backgrounded test run did not exit 30 s after its
    interrupt. Called before the event loop starts, so the interrupt cancels the stream and it ends cleanly."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


class IsoTime(click.ParamType):
    """An ISO-8601 time (UTC when it names no offset), as microseconds since the epoch."""
    name = "ISO-8601"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_iso(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


def global_options(fn: Callable[..., Any] | None = None, *, stream_flag: str | None = None) -> Any:
    """Add the global options to a command; it receives them as one ``Globals`` named ``g``. ``stream_flag`` names
    the command's flag that makes it a stream ended only by an interrupt (see ``take_interrupts``)."""
    if fn is None:
        return functools.partial(global_options, stream_flag=stream_flag)

    @functools.wraps(fn)
    def wrapper(*args: Any, endpoints: str | None, token: str | None, token_file: str | None, write_out: str,
                dir_: str | None, cacert: str | None, cert: str | None, key: str | None, consistency: str,
                **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        if stream_flag is not None and kwargs.get(stream_flag):
            take_interrupts()
        return run(lambda: explain_tls_refusal(
            fn(*args, g=resolve(ctx, endpoints, token, token_file, write_out, dir_, (cacert, cert, key), consistency),
               **kwargs),
            cacert, cert))

    for option in reversed((
        click.option("--endpoints", envvar="STATOR_ENDPOINTS", metavar="URL[,URL...]",
                     help=f"meta node URLs (env STATOR_ENDPOINTS; default {DEFAULT_ENDPOINT})"),
        click.option("--token", envvar="STATOR_TOKEN", help="a bearer token (env STATOR_TOKEN)"),
        click.option("--token-file", metavar="FILE", help="a file holding the token (mode 600 or stricter)"),
        click.option("-w", "--write-out", type=click.Choice(WRITE_OUT), default="table", show_default=True,
                     help="table for people, json for scripts (one JSON document)"),
        click.option("--cacert", metavar="FILE", help="verify the endpoints' certificates against this CA"),
        click.option("--cert", metavar="FILE", help="a client certificate, for servers that require one"),
        click.option("--key", metavar="FILE", help="the client certificate's key"),
        click.option("--dir", "dir_", metavar="DIR", help="a `stator dev` cluster: endpoints and admin token from "
                                                          "its cluster.json"),
        click.option("--consistency", type=click.Choice(("linearizable", "serializable")), default="linearizable",
                     show_default=True, help="reads through the leader's read barrier (see every write acknowledged "
                                             "before, as etcdctl's default), or from the answering node's own state "
                                             "(no leader needed)"),
    )):
        wrapper = option(wrapper)
    return wrapper


TLS_PROBE_TIMEOUT_S = 5.0


def explain_tls_refusal(result: Any, cacert: str | None, cert: str | None) -> Any:
    """``result``, a command's coroutine, with an UNAVAILABLE that is only "Server disconnected" turned into what it
    means, in the CLI's words: a TLS port asked in plain http://; a server that requires a client certificate we did
    not give (or does not accept the one we gave): such a server only closes the connection."""
    if not asyncio.iscoroutine(result):
        return result

    async def explained() -> Any:
        try:
            return await result
        except Unavailable as e:
            where = urlsplit(e.url or "")
            # Only a connection the server closed on us is asked about (what a TLS port does with plain HTTP): a
            # refused or timed-out one is its own answer, and a probe would only add its wait
            if where.scheme == "http" and where.hostname and isinstance(e.cause, aiohttp.ServerDisconnectedError) \
                    and await asyncio.to_thread(speaks_tls, where.hostname, where.port or 80, TLS_PROBE_TIMEOUT_S):
                raise CliError(UNAVAILABLE, f"{where.scheme}://{where.netloc} speaks TLS: give its https:// URL "
                                            "(and --cacert, the CA that signed its certificate)") from None
            if TLS_DISCONNECT_HINT not in e.message:
                raise
            # A connection closed on us over https: the library's hint names a Python function, not an option
            said = e.message.replace(TLS_DISCONNECT_HINT, "")
            if cert:
                raise CliError(UNAVAILABLE, f"{said} (the server may not accept the client certificate {cert}: is "
                                            "it signed by a CA the server trusts, and --key its key?)") from None
            if where.hostname and await asyncio.to_thread(client_certificate_required, where.hostname,
                                                          where.port or 443, TlsFiles(ca=cacert), TLS_PROBE_TIMEOUT_S):
                raise CliError(UNAUTHENTICATED, f"{where.scheme}://{where.netloc} requires a client certificate (its "
                                                "tls has client_auth): give --cert and --key, a certificate its CA "
                                                "signed") from None
            raise CliError(UNAVAILABLE, f"{said} (a server that requires client certificates closes the connection "
                                        "this way: --cert and --key give one)") from None
    return explained()


def run(make: Callable[[], Any]) -> Any:
    """Run the command; an API or CLI error becomes ``error: CODE: message`` on stderr and exit status 1.
    An interrupt (Ctrl-C) ends a stream (``--watch``, ``--follow``) normally."""
    try:
        result = make()
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        return result
    except StatorError as e:
        output.fail(e.code, e.message)
    except CliError as e:
        output.fail(e.code, e.message)
    except KeyboardInterrupt:
        return None

