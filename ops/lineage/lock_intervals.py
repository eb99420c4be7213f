"""The ``lock_intervals`` table: who held each exclusive lock, derived from lock events with a window.

One row per grant (a fencing token is larger than every earlier one, so a grant is named by its token): held
``[from_ts, to_ts)`` (and ``[from_version, to_version)``) from its LockGranted to the LockReleased of the same token,
whatever ended it (``reason``: released, left, lease_expired, topic_deleted); ``to`` is null while still held.
``revoked_from`` is when the lock's target first moved away from its holder (LockTargetChanged): the holder was asked
to give it up and kept it, and its token, until the release.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from .tables import LOCK_DATA, parsed

EVENT_TYPES = ("LockGranted", "LockTargetChanged", "LockReleased")
COLUMNS = ("group", "topic", "queue", "member", "token", "from_ts", "from_version", "to_ts", "to_version", "reason",
           "revoked_from")


def derive(locks: DataFrame) -> DataFrame:
    """Lock intervals of every lock in ``locks`` (filter it by group, topic, queue first to derive only those)."""
    ev = parsed(locks.where(F.col("type").isin(*EVENT_TYPES)), LOCK_DATA)
    grant = Window.partitionBy("group", "topic", "queue", "token")
    t = F.col("type")
    released = t == "LockReleased"
    away = (t == "LockTargetChanged") & (F.col("d.target").isNull() | (F.col("d.target") != F.col("member")))
    return ev.select(
        "type", "group", "topic", "queue", "member", "token",
        F.col("ts").alias("from_ts"), F.col("version").alias("from_version"),
        F.min(F.when(released, F.col("ts"))).over(grant).alias("to_ts"),
        F.min(F.when(released, F.col("version"))).over(grant).alias("to_version"),
        F.max(F.when(released, F.col("reason"))).over(grant).alias("reason"),
        F.min(F.when(away, F.col("ts"))).over(grant).alias("revoked_from"),
    ).where(t == "LockGranted").select(*COLUMNS)
