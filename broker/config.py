"""A broker's configuration file (JSON or TOML)."""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BrokerConfig:
    broker: str
    data_dir: str
    http_host: str
    http_port: int
    meta_urls: tuple[str, ...]
    token: str                  # broker-role token for meta and for reads between brokers
    client_token: str           # accepted from clients
    admin_token: str | None = None
    zone: str | None = None
    flush: str = "fsync"        # "fsync" per batch or "interval"
    flush_interval_ms: int = 200
    retention_ms: int | None = None      # delete whole segment files older than this (None keeps everything)
    retention_bytes: int | None = None   # ... or beyond this size per physical queue
    log_level: str = "info"

    @property
    def url(self) -> str:
        return f"http://{self.http_host}:{self.http_port}"


class ConfigError(ValueError):
    pass


def load(path: str) -> BrokerConfig:
    with open(path, "rb") as f:
        raw = tomllib.load(f) if path.endswith(".toml") else json.load(f)
    return parse(raw, os.path.dirname(os.path.abspath(path)))


def parse(raw: dict[str, Any], base_dir: str = ".") -> BrokerConfig:
    try:
        host, port = raw["http"].rsplit(":", 1)
        tokens = raw.get("tokens", {})
        flush = raw.get("flush", "fsync")
        if flush not in ("fsync", "interval"):
            raise ConfigError("flush must be 'fsync' or 'interval'")
        return BrokerConfig(
            broker=raw["broker"], data_dir=os.path.join(base_dir, raw["data_dir"]), http_host=host,
            http_port=int(port), meta_urls=tuple(u.rstrip("/") for u in raw["meta"]),
            token=raw.get("token") or tokens["broker"], client_token=raw.get("client_token") or tokens["client"],
            admin_token=tokens.get("admin"), zone=raw.get("zone"), flush=flush,
            flush_interval_ms=int(raw.get("flush_interval_ms", 200)), log_level=raw.get("log_level", "info"),
            retention_ms=raw.get("retention_ms"), retention_bytes=raw.get("retention_bytes"))
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"bad broker config: {type(e).__name__}: {e}") from e
