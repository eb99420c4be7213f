"""Reading a node's configuration file (JSON or TOML) against a schema that refuses unknown keys by name.

Shared by the meta node (meta/config.py) and the broker (broker/config.py). Every problem becomes one
``ConfigError`` whose message is a single line for the operator: the node must not start on a guess.
"""

from __future__ import annotations

import difflib
import json
import os
import stat
import tomllib
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from wire.names import BROKER_NAME_CHARS_MAX, NAME_RE

META_MEMBERS_MAX = 7           # a larger Raft group only slows every commit
PORT_MIN = 1
PORT_MAX = 65_535
HOST_CHARS_MAX = 253           # longest DNS name
URL_CHARS_MAX = 2_048
PATH_CHARS_MAX = 4_096
SECRET_CHARS_MIN = 16          # a token or cluster secret shorter than this is guessable
SECRET_CHARS_MAX = 1_024
ECHOED_VALUE_CHARS_MAX = 80    # a bad value is quoted in the message, cut to this length
SUGGESTIONS_CUTOFF = 0.6       # difflib similarity above which an unknown key is taken for a misspelling
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# Keys whose values are never quoted back in an error message: it goes to a terminal and to logs.
SECRET_KEYS = frozenset({"secret", "tokens", "token", "client_token", "admin_token"})

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration the node must not start with; the message is one line meant for the operator."""


class Schema(BaseModel):
    # extra="forbid": a misspelt key is an error, never a silently used default.
    # strict: "9000" is not 9000 and true is not 1; a config file says what it means.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def split_host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or any(c.isspace() for c in host) or len(host) > HOST_CHARS_MAX:
        raise ValueError("must be host:port")
    if not port.isdigit() or not PORT_MIN <= int(port) <= PORT_MAX:
        raise ValueError(f"port must be an integer in [{PORT_MIN}, {PORT_MAX}]")
    return host, int(port)


def _host_port(value: str) -> str:
    split_host_port(value)
    return value


def _http_url(value: str) -> str:
    try:
        parts = urlsplit(value)
        port = parts.port  # raises ValueError when out of range or not a number
    except ValueError:
        raise ValueError("must be an http:// or https:// URL with a valid port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or (port is not None and port < PORT_MIN):
        raise ValueError("must be an http:// or https:// URL with a host")
    return value.rstrip("/")


# Node and broker names: what meta accepts for a broker name, so a config meta would refuse fails at start.
Name = Annotated[str, Field(min_length=1, max_length=BROKER_NAME_CHARS_MAX, pattern=NAME_RE.pattern)]
HostPort = Annotated[str, Field(max_length=HOST_CHARS_MAX + 6), AfterValidator(_host_port)]
HttpUrl = Annotated[str, Field(max_length=URL_CHARS_MAX), AfterValidator(_http_url)]
Path = Annotated[str, Field(min_length=1, max_length=PATH_CHARS_MAX)]
Secret = Annotated[str, Field(min_length=SECRET_CHARS_MIN, max_length=SECRET_CHARS_MAX)]
LogLevel = typing.Literal[LOG_LEVELS]  # type: ignore[valid-type]


def read(path: str) -> dict[str, Any]:
    """The file's top-level object: TOML if the name ends in .toml, else JSON (a key given twice is refused)."""
    kind = "TOML" if path.endswith(".toml") else "JSON"
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f) if kind == "TOML" else json.load(f, object_pairs_hook=_no_duplicate_keys)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    except ValueError as e:  # JSONDecodeError, TOMLDecodeError and UnicodeDecodeError are all ValueErrors
        raise ConfigError(f"{path}: not valid {kind}: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: must hold an object of settings, not a {type(raw).__name__}")
    return raw


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise ValueError(f"key {dupes[0]!r} given twice")
    return dict(pairs)


def load(path: str, parse: Callable[[dict[str, Any], str], T]) -> T:
    """``parse(raw, base_dir)`` of the file at ``path``; relative paths inside it are taken from its directory.

    ``secrets_file = "PATH"`` names a second file (JSON or TOML, mode 600 or stricter) holding the secret keys
    (``secret``, ``tokens``, ``token``, ``client_token``), so the main config can be shared, versioned and read by
    anyone while the secrets stay in one guarded file."""
    raw = read(path)
    base_dir = os.path.dirname(os.path.abspath(path))
    try:
        if "secrets_file" in raw:
            raw = _with_secrets(raw, base_dir)
        return parse(raw, base_dir)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def check_private(path: str) -> None:
    """Refuse a secret's file that group or others may access, as ssh refuses a readable private key."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{path}: not a regular file")
    if st.st_mode & 0o077:
        raise ConfigError(f"{path}: permissions {stat.S_IMODE(st.st_mode):04o} are too open (group or others have "
                          f"access): chmod 600 {path}")


def _with_secrets(raw: dict[str, Any], base_dir: str) -> dict[str, Any]:
    name = raw["secrets_file"]
    if not isinstance(name, str) or not name:
        raise ConfigError("secrets_file: must be a path")
    path = os.path.join(base_dir, name)
    check_private(path)
    secrets = read(path)
    foreign = sorted(set(secrets) - SECRET_KEYS)
    if foreign:
        raise ConfigError(f"secrets_file {path}: only {sorted(SECRET_KEYS)} belong there, not {foreign[0]!r}")
    twice = sorted(set(secrets) & set(raw))
    if twice:
        raise ConfigError(f"{twice[0]!r} is in both the config and its secrets_file {path}: keep it in one place")
    return {**{k: v for k, v in raw.items() if k != "secrets_file"}, **secrets}


def check(schema: type[M], raw: Any) -> M:
    """``raw`` validated against ``schema``, or a ConfigError naming every offending key on one line."""
    try:
        return schema.model_validate(raw)
    except ValidationError as e:
        raise ConfigError("; ".join(_describe(schema, err) for err in e.errors())) from None


def _describe(schema: type[BaseModel], err: dict[str, Any]) -> str:
    where = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        return f"unknown key {where!r}{_suggestion(schema, err['loc'])}"
    if err["type"] == "missing":
        return f"missing key {where!r}"
    message = err["msg"].removeprefix("Value error, ")
    if not where:  # a check across several keys
        return message
    if SECRET_KEYS.isdisjoint(str(p) for p in err["loc"]):
        message += f" (got {_short(err['input'])})"
    return f"{where}: {message}"


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= ECHOED_VALUE_CHARS_MAX else text[:ECHOED_VALUE_CHARS_MAX] + "..."


def _suggestion(schema: type[BaseModel], loc: tuple[Any, ...]) -> str:
    model = _model_at(schema, loc[:-1])
    if model is None:
        return ""
    known = list(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=SUGGESTIONS_CUTOFF)
    return f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(known)})"


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The schema of the object at ``loc`` (list indexes skipped), to name the keys it knows."""
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        inner = _inner_model(field.annotation) if field is not None else None
        if inner is None:
            return None
        model = inner
    return model


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        for arg in typing.get_args(annotation):
            found = _inner_model(arg)
            if found is not None:
                return found
    return None


class TlsSchema(Schema):
    """``tls = {cert, key, ca?, client_auth?}``: serve HTTPS with this certificate and key. ``ca`` is trust: the node
    verifies the nodes it calls against it and, with ``client_auth``, requires every client (and every other node) to
    present a certificate it signed. ``client_auth`` defaults to whether ``ca`` is given, as before the key existed."""
    cert: Path
    key: Path
    ca: Path | None = None
    client_auth: bool | None = None

    @model_validator(mode="after")
    def _client_auth_needs_a_ca(self) -> TlsSchema:
        if self.client_auth and self.ca is None:
            raise ValueError("client_auth = true needs ca: the CA whose signature a client certificate must bear")
        return self


def tls_files(schema: TlsSchema | None, base_dir: str):
    """The TLS files of a config (paths relative to the config file's directory), or None for plain HTTP."""
    from wire.tls import TlsFiles
    if schema is None:
        return None
    at = lambda p: os.path.join(base_dir, p) if p is not None else None  # noqa: E731
    return TlsFiles(cert=at(schema.cert), key=at(schema.key), ca=at(schema.ca), client_auth=schema.client_auth)


@dataclass(frozen=True)
class MetricsListener:
    """Where /metrics, /healthz and /readyz are also served, and nothing else: never a client certificate asked
    for there, so a Prometheus server or a load balancer's health check needs none while the API demands them."""
    host: str
    port: int
    tls: bool   # HTTPS with the node's certificate (server-only TLS), or plain HTTP


def _metrics_listen(value: str) -> str:
    scheme, sep, rest = value.partition("://")
    if sep and scheme not in ("http", "https"):
        raise ValueError("must be host:port, http://host:port or https://host:port")
    split_host_port(rest if sep else value)
    return value


# ``host:port`` (HTTPS when the node has tls, else HTTP), ``http://host:port`` or ``https://host:port``.
MetricsListen = Annotated[str, Field(max_length=HOST_CHARS_MAX + 14), AfterValidator(_metrics_listen)]


def metrics_listener(value: str | None, tls: Any, http_port: int) -> MetricsListener | None:
    """The checked ``metrics_listen`` of a config whose API listens on ``http_port`` with ``tls`` (TlsFiles)."""
    if value is None:
        return None
    scheme, sep, rest = value.partition("://")
    host, port = split_host_port(rest if sep else value)
    https = scheme == "https" if sep else tls is not None
    if https and tls is None:
        raise ConfigError(f"metrics_listen {value!r}: https needs the node's tls (its cert and key)")
    # The server tells the two listeners apart by the local port a request arrived on.
    if port == http_port:
        raise ConfigError(f"metrics_listen {value!r}: needs a port of its own, not the API's {http_port}")
    return MetricsListener(host, port, https)
