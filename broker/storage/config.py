"""Per-queue settings, validated once at construction so the hot path trusts them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import limits
from .errors import InvalidArgument

FLUSH_FSYNC = "fsync"
FLUSH_INTERVAL = "interval"
FLUSH_GROUP = "group"
FLUSH_POLICIES = (FLUSH_FSYNC, FLUSH_INTERVAL, FLUSH_GROUP)


@dataclass(frozen=True, slots=True)
class QueueConfig:
    segment_bytes_max: int = limits.SEGMENT_BYTES_MAX_DEFAULT
    index_interval_bytes: int = limits.INDEX_INTERVAL_BYTES_DEFAULT
    index_interval_records: int = limits.INDEX_INTERVAL_RECORDS_DEFAULT
    # "fsync": every append is on disk before it returns. "interval": the owner calls maybe_flush(now_ms).
    # "group": an append returns once written and the owner syncs many appends of many queues at once
    # (pending_sync, synced: group commit); readers see only what a sync covered (max_offset).
    flush_policy: str = FLUSH_FSYNC
    flush_interval_ms: int = limits.FLUSH_INTERVAL_MS_DEFAULT
    # Retention deletes whole files only; None keeps everything.
    retention_ms: int | None = None
    retention_bytes: int | None = None
    # Told the seconds of each fsync of a segment file (the broker's metrics); called on the appending thread.
    observe_sync_s: Callable[[float], None] | None = None

    def __post_init__(self) -> None:
        _check_range("segment_bytes_max", self.segment_bytes_max,
                     limits.SEGMENT_BYTES_LIMIT_MIN, limits.SEGMENT_BYTES_LIMIT_MAX)
        _check_range("index_interval_bytes", self.index_interval_bytes,
                     limits.INDEX_INTERVAL_BYTES_MIN, limits.INDEX_INTERVAL_BYTES_MAX)
        _check_range("index_interval_records", self.index_interval_records,
                     limits.INDEX_INTERVAL_RECORDS_MIN, limits.INDEX_INTERVAL_RECORDS_MAX)
        if self.flush_policy not in FLUSH_POLICIES:
            raise InvalidArgument(f"flush_policy must be one of {FLUSH_POLICIES}", flush_policy=self.flush_policy)
        _check_range("flush_interval_ms", self.flush_interval_ms, 0, limits.FLUSH_INTERVAL_MS_MAX)
        if self.retention_ms is not None:
            _check_range("retention_ms", self.retention_ms, 0, limits.TS_MS_MAX)
        if self.retention_bytes is not None:
            _check_range("retention_bytes", self.retention_bytes, 0, 2**63 - 1)


def _check_range(name: str, value: object, low: int, high: int) -> None:
    if type(value) is not int or not low <= value <= high:
        raise InvalidArgument(f"{name} must be an integer in [{low}, {high}]", **{name: value})
