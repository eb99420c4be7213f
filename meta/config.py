"""A meta node's configuration file (TOML or JSON), parsed once into frozen dataclasses."""

from __future__ import annotations

import hmac
import json
import os
import tomllib
from dataclasses import dataclass, field, fields
from typing import Any

from . import limits
from .raft_node import RaftTuning


@dataclass(frozen=True)
class Member:
    node: str
    raft: str   # host:port of the Raft transport
    url: str    # base URL of the node's HTTP API


@dataclass(frozen=True)
class Tokens:
    admin: str
    broker: str
    client: str

    def role_of(self, token: str) -> str | None:
        found = None
        for role in ("admin", "broker", "client"):  # constant time: no early exit, no short-circuit compare
            if hmac.compare_digest(token.encode(), getattr(self, role).encode()):
                found = found or role
        return found


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
    offset_budget: int = limits.OFFSET_BUDGET_DEFAULT
    session_timeout_ms: int = limits.BROKER_SESSION_TIMEOUT_MS
    heartbeat_interval_ms: int = limits.BROKER_HEARTBEAT_INTERVAL_MS
    raft_tuning: RaftTuning = field(default_factory=RaftTuning)
    log_level: str = "info"

    @property
    def partners(self) -> list[str]:
        return [m.raft for m in self.members if m.node != self.node]

    def member_by_raft(self, raft: str | None) -> Member | None:
        return next((m for m in self.members if m.raft == raft), None)


class ConfigError(ValueError):
    pass


def load(path: str) -> MetaConfig:
    with open(path, "rb") as f:
        raw = tomllib.load(f) if path.endswith(".toml") else json.load(f)
    return parse(raw, base_dir=os.path.dirname(os.path.abspath(path)))


def parse(raw: dict[str, Any], base_dir: str = ".") -> MetaConfig:
    try:
        data_dir = os.path.join(base_dir, raw["data_dir"])
        host, port = raw["http"].rsplit(":", 1)
        members = tuple(Member(m["node"], m["raft"], m["url"].rstrip("/")) for m in raw["members"])
        me = next(m for m in members if m.node == raw["node"])
        tuning_raw = raw.get("raft_tuning", {})
        known = {f.name for f in fields(RaftTuning)}
        unknown = set(tuning_raw) - known
        if unknown:
            raise ConfigError(f"unknown raft_tuning keys: {sorted(unknown)}")
        secret = raw["secret"]
        if len(secret) < 16:
            raise ConfigError("secret must be at least 16 characters")
        return MetaConfig(
            node=raw["node"], data_dir=data_dir, http_host=host, http_port=int(port), raft=me.raft, secret=secret,
            tokens=Tokens(**raw["tokens"]), members=members,
            projection_url=raw.get("projection_url") or f"sqlite:///{os.path.join(data_dir, 'projection.db')}",
            offset_budget=int(raw.get("offset_budget", limits.OFFSET_BUDGET_DEFAULT)),
            session_timeout_ms=int(raw.get("session_timeout_ms", limits.BROKER_SESSION_TIMEOUT_MS)),
            heartbeat_interval_ms=int(raw.get("heartbeat_interval_ms", limits.BROKER_HEARTBEAT_INTERVAL_MS)),
            raft_tuning=RaftTuning(**tuning_raw), log_level=raw.get("log_level", "info"),
        )
    except (KeyError, StopIteration, TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"bad meta config: {type(e).__name__}: {e}") from e
