"""A meta node's configuration file (TOML or JSON), checked against a schema once, then kept as frozen dataclasses."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from runtime import config_file
from runtime.config_file import (META_MEMBERS_MAX, ConfigError, HostPort, HttpUrl, LogLevel, Name, Path, Schema, Secret,
                             MetricsListen, MetricsListener, TlsSchema, metrics_listener, split_host_port,
                             tls_files)

from wire.tls import TlsFiles
from runtime.connection_limit import HTTP_CONNECTIONS_LIMIT_MAX, HTTP_CONNECTIONS_MAX_DEFAULT
from runtime.credentials import BROKER_TOKENS_MAX, check_hash, token_hash
from runtime.server import role_of

from . import limits
from .raft.node import RaftTuning

__all__ = ["ConfigError", "MetaConfig", "Member", "Tokens", "load", "parse"]


@dataclass(frozen=True)
class Member:
    node: str
    raft: str   # host:port of the Raft transport
    url: str    # base URL of the node's HTTP API


@dataclass(frozen=True)
class Tokens:
    admin: str
    client: str

    def by_role(self) -> dict[str, str]:
        # No "broker" role token: each broker proves its own id with its own token (MetaConfig.broker_tokens).
        return {"admin": self.admin, "client": self.client}

    def role_of(self, token: str) -> str | None:
        return role_of(token, self.by_role())


@dataclass(frozen=True)
class MetaConfig:
    node: str
    data_dir: str
    http_host: str
    http_port: int
    raft: str
    secret: str
    tokens: Tokens
    members: tuple[Member, ...]
    projection_url: str
    broker_tokens: Mapping[str, str] = field(default_factory=dict)   # broker id -> "sha256:<hex>" of its token
    offset_budget: int = limits.OFFSET_BUDGET_DEFAULT
    session_timeout_ms: int = limits.BROKER_SESSION_TIMEOUT_MS
    heartbeat_interval_ms: int = limits.BROKER_HEARTBEAT_INTERVAL_MS
    # A new topic's copies when it names none, each capped at the active brokers it is placed over
    default_replicas: int = limits.REPLICAS_DEFAULT
    default_min_insync: int = limits.MIN_INSYNC_DEFAULT
    raft_tuning: RaftTuning = field(default_factory=RaftTuning)
    log_level: str = "info"
    # Events the image's history keeps. The leader stamps its own into every command, so the log decides the window
    # (replicas never diverge); give every member the same value, or the window changes with the leader.
    history_window: int = limits.HISTORY_EVENTS_MAX
    tls: TlsFiles | None = None   # HTTPS for the API and for calls to other nodes (wire/tls.py)
    metrics_listen: MetricsListener | None = None   # a second listener for /metrics and the health checks
    http_connections_max: int = HTTP_CONNECTIONS_MAX_DEFAULT   # more open connections are refused 503

    @property
    def partners(self) -> list[str]:
        return [m.raft for m in self.members if m.node != self.node]

    def member_by_raft(self, raft: str | None) -> Member | None:
        return next((m for m in self.members if m.raft == raft), None)


def _database_url(value: str) -> str:
    # Imported here: a node imports SQLAlchemy only once it reads history from its projection (~0.4 s of CPU).
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError
    try:
        make_url(value)
    except ArgumentError:
        raise ValueError("must be a SQLAlchemy database URL such as postgresql+psycopg://host/db") from None
    return value


# Bounds of the file's settings, each with its unit last.
OFFSET_BUDGET_MAX = 1_000_000_000                # a crashed broker's next segment starts a whole budget later
SESSION_TIMEOUT_MS_MAX = 24 * 3_600_000          # a broker gone this long is long gone
HEARTBEAT_INTERVAL_MS_MAX = 60_000
RAFT_TIMEOUT_S_MAX = 60.0                        # election, leader fallback and connection timeouts
RAFT_PERIOD_S_MAX = 10.0                         # heartbeat period and reconnect delay
RAFT_COMPACTION_MIN_ENTRIES_MAX = 10_000_000
RAFT_COMPACTION_MIN_TIME_S_MAX = 86_400
RAFT_SNAPSHOT_CHUNK_BYTES_MIN = 4 * 1024
RAFT_SNAPSHOT_CHUNK_BYTES_MAX = 16 * 1024 * 1024  # one raft message: read, decrypted and parsed at once
RAFT_COMMANDS_QUEUE_MAX = 10_000_000
RAFT_PROPOSE_COALESCE_S_MAX = 0.05   # a proposal's wait for others: past it, latency a writer would notice
RAFT_HEARTBEATS_PER_ELECTION_TIMEOUT_MIN = 3     # pysyncobj refuses a shorter election timeout (SyncObjConf.validate)


class _RaftTuningSchema(Schema):
    election_timeout_min_s: float = Field(RaftTuning.election_timeout_min_s, gt=0, le=RAFT_TIMEOUT_S_MAX)
    election_timeout_max_s: float = Field(RaftTuning.election_timeout_max_s, gt=0, le=RAFT_TIMEOUT_S_MAX)
    append_entries_period_s: float = Field(RaftTuning.append_entries_period_s, gt=0, le=RAFT_PERIOD_S_MAX)
    leader_fallback_timeout_s: float = Field(RaftTuning.leader_fallback_timeout_s, gt=0, le=RAFT_TIMEOUT_S_MAX)
    connection_timeout_s: float = Field(RaftTuning.connection_timeout_s, gt=0, le=RAFT_TIMEOUT_S_MAX)
    connection_retry_s: float = Field(RaftTuning.connection_retry_s, gt=0, le=RAFT_PERIOD_S_MAX)
    compaction_min_entries: int = Field(RaftTuning.compaction_min_entries, ge=2, le=RAFT_COMPACTION_MIN_ENTRIES_MAX)
    compaction_min_time_s: int = Field(RaftTuning.compaction_min_time_s, ge=1, le=RAFT_COMPACTION_MIN_TIME_S_MAX)
    commands_queue_max: int = Field(RaftTuning.commands_queue_max, ge=1, le=RAFT_COMMANDS_QUEUE_MAX)
    # 0 turns the coalescing of proposals under load off (meta/raft/node.py RaftTuning says what it does).
    propose_coalesce_s: float = Field(RaftTuning.propose_coalesce_s, ge=0, le=RAFT_PROPOSE_COALESCE_S_MAX)
    propose_coalesce_min: int = Field(RaftTuning.propose_coalesce_min, ge=1, le=RAFT_COMMANDS_QUEUE_MAX)
    snapshot_chunk_bytes: int = Field(RaftTuning.snapshot_chunk_bytes, ge=RAFT_SNAPSHOT_CHUNK_BYTES_MIN,
                                      le=RAFT_SNAPSHOT_CHUNK_BYTES_MAX)
    # "fsync" (default): the journal is fdatasynced before a node acknowledges entries (group commit per tick), so
    # an acknowledged write survives a power loss of every node; "none": written, never synced (kill -9 safe).
    journal_sync: Literal["fsync", "none"] = RaftTuning.journal_sync
    # "os" (default); "memory_until_sync" keeps unsynced journal writes in the process, so a kill -9 loses what a
    # power loss would: for tests and the chaos runner, never for a node that must keep its data.
    journal_io: Literal["os", "memory_until_sync"] = RaftTuning.journal_io

    @model_validator(mode="after")
    def _timeouts_in_order(self) -> _RaftTuningSchema:
        # The relations pysyncobj asserts at start-up, refused here with the keys' names instead of a traceback.
        period = self.append_entries_period_s
        if self.election_timeout_min_s <= period * RAFT_HEARTBEATS_PER_ELECTION_TIMEOUT_MIN:
            raise ValueError(f"raft_tuning.election_timeout_min_s must exceed "
                             f"{RAFT_HEARTBEATS_PER_ELECTION_TIMEOUT_MIN} x append_entries_period_s")
        if self.election_timeout_max_s <= self.election_timeout_min_s:
            raise ValueError("raft_tuning.election_timeout_max_s must exceed election_timeout_min_s")
        if self.leader_fallback_timeout_s <= period:
            raise ValueError("raft_tuning.leader_fallback_timeout_s must exceed append_entries_period_s")
        if self.leader_fallback_timeout_s > self.election_timeout_max_s:
            # A cut-off leader must stop acting as leader by the time the others can have elected a new one.
            raise ValueError("raft_tuning.leader_fallback_timeout_s must not exceed election_timeout_max_s")
        if self.connection_timeout_s < self.election_timeout_max_s:
            raise ValueError("raft_tuning.connection_timeout_s must be at least election_timeout_max_s")
        return self


class _MemberSchema(Schema):
    node: Name
    raft: HostPort
    url: HttpUrl


REMOVED_SHARED_BROKER_TOKEN = ("tokens.broker is no longer read: one token shared by every broker let any broker act "
                               "as another. Give each broker its own token and name it here by its hash under "
                               '[broker_tokens] (b1 = "sha256:<hex>"; see docs/operations.md)')


class _TokensSchema(Schema):
    admin: Secret
    client: Secret

    @model_validator(mode="before")
    @classmethod
    def _no_shared_broker_token(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and "broker" in raw:
            raise ValueError(REMOVED_SHARED_BROKER_TOKEN)
        return raw

    @model_validator(mode="after")
    def _distinct(self) -> _TokensSchema:
        # Tokens.role_of takes the first role whose token matches: a shared token would grant the higher role.
        if self.admin == self.client:
            raise ValueError("tokens.admin and tokens.client must differ")
        return self


BrokerTokenHash = Annotated[str, AfterValidator(check_hash)]


class _MetaSchema(Schema):
    node: Name
    data_dir: Path
    http: HostPort
    secret: Secret
    tokens: _TokensSchema
    members: list[_MemberSchema] = Field(min_length=1, max_length=META_MEMBERS_MAX)
    # Each broker's own token, by its hash: a broker proves its id with it, and acts for no other (issue 20, 7b).
    broker_tokens: dict[Name, BrokerTokenHash] = Field(default_factory=dict, max_length=BROKER_TOKENS_MAX)
    projection_url: Annotated[str, Field(min_length=1), AfterValidator(_database_url)] | None = None
    offset_budget: int = Field(limits.OFFSET_BUDGET_DEFAULT, ge=1, le=OFFSET_BUDGET_MAX)
    session_timeout_ms: int = Field(limits.BROKER_SESSION_TIMEOUT_MS, ge=1, le=SESSION_TIMEOUT_MS_MAX)
    heartbeat_interval_ms: int = Field(limits.BROKER_HEARTBEAT_INTERVAL_MS, ge=1, le=HEARTBEAT_INTERVAL_MS_MAX)
    default_replicas: int = Field(limits.REPLICAS_DEFAULT, ge=1, le=limits.REPLICAS_MAX)
    default_min_insync: int = Field(limits.MIN_INSYNC_DEFAULT, ge=1, le=limits.REPLICAS_MAX)
    raft_tuning: _RaftTuningSchema = Field(default_factory=_RaftTuningSchema)
    log_level: LogLevel = "info"
    history_window: int = Field(limits.HISTORY_EVENTS_MAX, ge=limits.HISTORY_WINDOW_MIN, le=limits.HISTORY_WINDOW_MAX)
    tls: TlsSchema | None = None
    metrics_listen: MetricsListen | None = None   # /metrics, /healthz, /readyz without client certificates
    http_connections_max: int = Field(HTTP_CONNECTIONS_MAX_DEFAULT, ge=1, le=HTTP_CONNECTIONS_LIMIT_MAX)

    @model_validator(mode="after")
    def _consistent(self) -> _MetaSchema:
        for key in ("node", "raft", "url"):
            values = [getattr(m, key) for m in self.members]
            if len(set(values)) < len(values):
                raise ValueError(f"members: each {key} must be unique")
        if len(set(self.broker_tokens.values())) < len(self.broker_tokens):
            raise ValueError("broker_tokens: each broker needs its own token (two hashes are equal)")
        if {token_hash(self.tokens.admin), token_hash(self.tokens.client)} & set(self.broker_tokens.values()):
            raise ValueError("broker_tokens: a broker's token must differ from tokens.admin and tokens.client")
        if self.node not in {m.node for m in self.members}:
            raise ValueError(f"node {self.node!r} is not among members")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be shorter than session_timeout_ms: "
                             "every broker session would lapse between two heartbeats")
        return self


def load(path: str) -> MetaConfig:
    return config_file.load(path, parse)


def parse(raw: dict[str, Any], base_dir: str = ".") -> MetaConfig:
    s = config_file.check(_MetaSchema, raw)
    data_dir = os.path.join(base_dir, s.data_dir)
    host, port = split_host_port(s.http)
    members = tuple(Member(m.node, m.raft, m.url) for m in s.members)
    return MetaConfig(
        node=s.node, data_dir=data_dir, http_host=host, http_port=port,
        raft=next(m.raft for m in members if m.node == s.node), secret=s.secret,
        tokens=Tokens(**s.tokens.model_dump()), members=members, broker_tokens=dict(s.broker_tokens),
        projection_url=s.projection_url or f"sqlite:///{os.path.join(data_dir, 'projection.db')}",
        offset_budget=s.offset_budget, session_timeout_ms=s.session_timeout_ms,
        heartbeat_interval_ms=s.heartbeat_interval_ms, default_replicas=s.default_replicas,
        default_min_insync=s.default_min_insync, raft_tuning=RaftTuning(**s.raft_tuning.model_dump()),
        log_level=s.log_level, history_window=s.history_window, tls=tls_files(s.tls, base_dir),
        metrics_listen=metrics_listener(s.metrics_listen, tls_files(s.tls, base_dir), port),
        http_connections_max=s.http_connections_max,
    )
