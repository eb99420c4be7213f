"""A broker's configuration file (JSON or TOML), checked against a schema once, then kept as a frozen dataclass."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from runtime import config_file
from wire.tls import TlsFiles
from runtime.credentials import BROKER_TOKENS_MAX, check_hash, token_hash
from runtime.connection_limit import HTTP_CONNECTIONS_LIMIT_MAX, HTTP_CONNECTIONS_MAX_DEFAULT
from runtime.config_file import (META_MEMBERS_MAX, ConfigError, HostPort, HttpUrl, LogLevel, Name, Path, Schema, Secret,
                             MetricsListen, MetricsListener, TlsSchema, metrics_listener, split_host_port,
                             tls_files)

from .storage.config import FLUSH_FSYNC, FLUSH_INTERVAL
from .storage.files import syncfs_unusable
from .storage.limits import (FLUSH_INTERVAL_MS_MAX, SEGMENT_BYTES_LIMIT_MAX, SEGMENT_BYTES_LIMIT_MIN,
                             SEGMENT_BYTES_MAX_DEFAULT, TS_MS_MAX)

__all__ = ["BrokerConfig", "ConfigError", "load", "parse"]

FLUSH_INTERVAL_MS_DEFAULT = 200
ZONE_CHARS_MAX = 64               # what meta accepts for a broker's zone at registration
CLUSTER_DEFAULT = "DefaultCluster"   # RocketMQ's default brokerClusterName: meta's limits.CLUSTER_DEFAULT
RETENTION_BYTES_MAX = 2**63 - 1   # file sizes are signed 64-bit everywhere
UNSPECIFIED_HOSTS = frozenset({"0.0.0.0", "::", "[::]"})   # bind to every interface: never a reachable address
FLUSHES = (FLUSH_FSYNC, FLUSH_INTERVAL)
# With flush "fsync": one sync of the data_dir's file system for the sends of every queue at once (group commit,
# group_commit.py), or an fdatasync of each queue's file per send.
SYNC_SCOPE_FILESYSTEM, SYNC_SCOPE_FILE = "filesystem", "file"
SYNC_SCOPES = (SYNC_SCOPE_FILESYSTEM, SYNC_SCOPE_FILE)


def default_sync_scope() -> str:
    """"filesystem" where syncfs can be trusted (Linux 5.8 and later: storage/files.syncfs_unusable), else "file"."""
    return SYNC_SCOPE_FILESYSTEM if syncfs_unusable() is None else SYNC_SCOPE_FILE


@dataclass(frozen=True)
class BrokerConfig:
    broker: str
    data_dir: str
    http_host: str
    http_port: int
    meta_urls: tuple[str, ...]
    token: str                  # this broker's own token: it proves this broker's id to meta and to other brokers
    client_token: str           # accepted from clients
    admin_token: str | None = None
    zone: str | None = None
    cluster: str = CLUSTER_DEFAULT   # the cluster it belongs to: topics scoped to it place queues here (issue 37)
    flush: str = FLUSH_FSYNC    # "fsync" per batch or "interval"
    sync_scope: str = field(default_factory=default_sync_scope)
    flush_interval_ms: int = FLUSH_INTERVAL_MS_DEFAULT
    retention_ms: int | None = None      # delete whole segment files older than this (None keeps everything)
    retention_bytes: int | None = None   # ... or beyond this size per physical queue
    segment_bytes_max: int = SEGMENT_BYTES_MAX_DEFAULT   # a segment file rolls before a batch takes it past this
    log_level: str = "info"
    advertise: str | None = None         # the URL others reach this broker at, when it differs from the bind address
    tls: TlsFiles | None = None          # HTTPS for the API and for calls to meta and other brokers (wire/tls.py)
    metrics_listen: MetricsListener | None = None   # a second listener for /metrics and the health checks
    http_connections_max: int = HTTP_CONNECTIONS_MAX_DEFAULT   # more open connections are refused 503
    # Other brokers' tokens by hash (broker id -> "sha256:<hex>"): the peers whose calls this broker accepts.
    broker_tokens: Mapping[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The address this broker registers with meta: clients and other brokers reach it there."""
        scheme = "https" if self.tls is not None else "http"
        return self.advertise or f"{scheme}://{self.http_host}:{self.http_port}"


class _TokensSchema(Schema):
    broker: Secret | None = None   # this broker's own token (meta names it by its hash under broker_tokens)
    client: Secret | None = None
    admin: Secret | None = None


class _BrokerSchema(Schema):
    broker: Name
    data_dir: Path
    http: HostPort
    # A broker bound to 0.0.0.0 (or behind NAT, in a container) must say where it is reached: meta hands this address
    # to every client in routes. Without it, the bind address is registered, which must then be reachable itself.
    advertise: HttpUrl | None = None
    meta: list[HttpUrl] = Field(min_length=1, max_length=META_MEMBERS_MAX)
    # The tokens come either as {"tokens": {...}} (the shape meta's config uses) or one by one; one-by-one wins.
    tokens: _TokensSchema = Field(default_factory=_TokensSchema)
    token: Secret | None = None
    client_token: Secret | None = None
    zone: Annotated[str, Field(min_length=1, max_length=ZONE_CHARS_MAX)] | None = None
    cluster: Name = CLUSTER_DEFAULT
    flush: Literal[FLUSHES] = FLUSH_FSYNC  # type: ignore[valid-type]
    sync_scope: Literal[SYNC_SCOPES] | None = None  # type: ignore[valid-type]  # None: default_sync_scope()
    flush_interval_ms: int = Field(FLUSH_INTERVAL_MS_DEFAULT, ge=1, le=FLUSH_INTERVAL_MS_MAX)
    retention_ms: int | None = Field(None, ge=1, le=TS_MS_MAX)
    retention_bytes: int | None = Field(None, ge=1, le=RETENTION_BYTES_MAX)
    segment_bytes_max: int = Field(SEGMENT_BYTES_MAX_DEFAULT, ge=SEGMENT_BYTES_LIMIT_MIN, le=SEGMENT_BYTES_LIMIT_MAX)
    log_level: LogLevel = "info"
    tls: TlsSchema | None = None
    metrics_listen: MetricsListen | None = None   # /metrics, /healthz, /readyz without client certificates
    http_connections_max: int = Field(HTTP_CONNECTIONS_MAX_DEFAULT, ge=1, le=HTTP_CONNECTIONS_LIMIT_MAX)
    # The peers' tokens by hash, as in meta's config: pop handovers and reads between brokers come with them.
    broker_tokens: dict[Name, Annotated[str, AfterValidator(check_hash)]] = Field(
        default_factory=dict, max_length=BROKER_TOKENS_MAX)

    @model_validator(mode="after")
    def _consistent(self) -> _BrokerSchema:
        if self.effective_broker_token is None:
            raise ValueError("missing the broker token: give tokens.broker (or token), this broker's own")
        mine = self.broker_tokens.get(self.broker)
        if mine is not None and mine != token_hash(self.effective_broker_token):
            raise ValueError(f"broker_tokens.{self.broker}: not the hash of this broker's own token")
        if self.effective_client_token is None:
            raise ValueError("missing the client token: give tokens.client (or client_token)")
        unusable = syncfs_unusable() if self.sync_scope == SYNC_SCOPE_FILESYSTEM else None
        if unusable is not None:
            raise ValueError(f'sync_scope "filesystem": {unusable}; set sync_scope "file"')
        if len(set(self.meta)) < len(self.meta):
            raise ValueError("meta: each URL must be unique")
        if self.advertise is None and split_host_port(self.http)[0] in UNSPECIFIED_HOSTS:
            raise ValueError(f"http {self.http!r} binds every interface, which is no address to reach: give advertise "
                             "(the URL clients and other brokers use, like http://broker-1.example:7200)")
        return self

    @property
    def effective_broker_token(self) -> str | None:
        return self.token or self.tokens.broker

    @property
    def effective_client_token(self) -> str | None:
        return self.client_token or self.tokens.client


def load(path: str) -> BrokerConfig:
    return config_file.load(path, parse)


def parse(raw: dict[str, Any], base_dir: str = ".") -> BrokerConfig:
    s = config_file.check(_BrokerSchema, raw)
    host, port = split_host_port(s.http)
    return BrokerConfig(
        broker=s.broker, data_dir=os.path.join(base_dir, s.data_dir), http_host=host, http_port=port,
        meta_urls=tuple(s.meta), token=s.effective_broker_token, client_token=s.effective_client_token,
        admin_token=s.tokens.admin, zone=s.zone, cluster=s.cluster, flush=s.flush,
        sync_scope=s.sync_scope or default_sync_scope(),
        flush_interval_ms=s.flush_interval_ms,
        retention_ms=s.retention_ms, retention_bytes=s.retention_bytes, segment_bytes_max=s.segment_bytes_max,
        log_level=s.log_level,
        advertise=s.advertise, tls=tls_files(s.tls, base_dir), http_connections_max=s.http_connections_max,
        metrics_listen=metrics_listener(s.metrics_listen, tls_files(s.tls, base_dir), port),
        broker_tokens=dict(s.broker_tokens))
