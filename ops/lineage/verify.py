"""``stator lineage verify``: what a sound export never shows. Each finding is a dict with ``kind``, ``message`` and
the keys to look at:

- ``version_gap`` (``first``, ``last``): versions missing between 1 and the last one exported (the state file's
  ``last_version`` when the driver can read it, else the largest version seen); ``duplicate_version`` (``version``);
- ``segment_overlap``: a segment whose logic offsets start before an earlier generation of the same queue (same
  incarnation) ends, or while that generation is still open;
- ``double_lock_holder``: a lock granted while another grant of the same (group, topic, queue) was not yet released.

At most FINDINGS_PER_KIND_MAX findings of each kind are listed; one ``more_findings`` finding says when a kind had more.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from . import lock_intervals, segments
from .tables import Export, micros
from wire.times import iso

FINDINGS_PER_KIND_MAX = 100
VERSION_BUCKET = 1_000_000   # versions are checked in order within buckets of this many, then bucket to bucket
NEVER = 2**62                # the end of an interval still open


def findings(export: Export, data: str) -> list[dict[str, Any]]:
    out = _version_findings(export, _last_exported(data))
    out += _segment_overlaps(segments.derive(export.mapping))
    out += _double_holders(lock_intervals.derive(export.locks))
    return out


def _limited(df: DataFrame, order: list[str]) -> list[Any]:
    """The first findings in ``order``, and one more to tell whether there were more."""
    return df.orderBy(*order).limit(FINDINGS_PER_KIND_MAX + 1).collect()


def _more(kind: str, rows: list[Any]) -> list[dict[str, Any]]:
    if len(rows) <= FINDINGS_PER_KIND_MAX:
        return []
    return [{"kind": "more_findings", "of": kind,
             "message": f"more than {FINDINGS_PER_KIND_MAX} {kind} findings; only the first are listed"}]


def _last_exported(data: str) -> int | None:
    """The export's own record of its last version (the exporter's state file, read on the driver through pyarrow:
    Spark skips files named with a leading underscore); None where pyarrow cannot open it."""
    from meta.export.exporter import Destination, ExportError
    try:
        # Spark's s3a:// is pyarrow's s3:// (the same bucket).
        return Destination(data.replace("s3a://", "s3://", 1), create=False).last_version() or None
    except (OSError, ValueError, ExportError):
        return None


def _version_findings(export: Export, last_exported: int | None) -> list[dict[str, Any]]:
    versions = export.mapping.select("version").unionByName(export.locks.select("version")) \
        .withColumn("bucket", F.floor((F.col("version") - 1) / VERSION_BUCKET))
    in_order = Window.partitionBy("bucket").orderBy("version")
    steps = versions.withColumn("prev", F.lag("version").over(in_order)).where(F.col("version") - F.col("prev") != 1)
    inner = _limited(steps, ["version"])
    ends = versions.groupBy("bucket").agg(F.min("version").alias("lo"), F.max("version").alias("hi")) \
        .orderBy("bucket").collect()
    pairs: list[tuple[int, int]] = [(r["prev"], r["version"]) for r in inner]
    bounds = [(0, None)] + [(r["lo"], r["hi"]) for r in ends]
    pairs += [(a[1] or 0, b[0]) for a, b in zip(bounds, bounds[1:]) if b[0] - (a[1] or 0) != 1]
    last_seen = ends[-1]["hi"] if ends else 0
    if last_exported is not None and last_exported > last_seen:
        pairs.append((last_seen, last_exported + 1))
    out: list[dict[str, Any]] = []
    for prev, version in sorted(set(pairs), key=lambda p: p[1]):
        if version == prev:
            out.append({"kind": "duplicate_version", "version": version,
                        "message": f"version {version} is exported more than once"})
        else:
            out.append({"kind": "version_gap", "first": prev + 1, "last": version - 1,
                        "message": f"versions {prev + 1}..{version - 1} are missing"})
    return out[:FINDINGS_PER_KIND_MAX] + _more("version_gap", inner)


def _segment_overlaps(segs: DataFrame) -> list[dict[str, Any]]:
    earlier = Window.partitionBy("topic", "incarnation", "queue").orderBy("gen", "route_from_version") \
        .rowsBetween(Window.unboundedPreceding, -1)
    reach = F.struct(F.coalesce(F.col("logic_end"), F.lit(NEVER)).alias("end"), F.col("gen").alias("gen"))
    seen = segs.where(F.col("logic_start").isNotNull()) \
        .withColumn("prev", F.max(reach).over(earlier)).where(F.col("logic_start") < F.col("prev.end"))
    rows = _limited(seen, ["topic", "incarnation", "queue", "gen"])
    out = []
    for r in rows[:FINDINGS_PER_KIND_MAX]:
        other = "is still open" if r["prev"]["end"] == NEVER else f"ends at {r['prev']['end']}"
        out.append({"kind": "segment_overlap", "topic": r["topic"], "incarnation": r["incarnation"],
                    "queue": r["queue"], "gen": r["gen"], "logic_start": r["logic_start"],
                    "other_gen": r["prev"]["gen"],
                    "message": f"{r['topic']} queue {r['queue']} gen {r['gen']} starts at logic offset "
                               f"{r['logic_start']} but gen {r['prev']['gen']} {other}"})
    return out + _more("segment_overlap", rows)


def _double_holders(intervals: DataFrame) -> list[dict[str, Any]]:
    earlier = Window.partitionBy("group", "topic", "queue").orderBy("from_version", "token") \
        .rowsBetween(Window.unboundedPreceding, -1)
    reach = F.struct(F.coalesce(F.col("to_version"), F.lit(NEVER)).alias("end"), F.col("token").alias("token"),
                     F.col("member").alias("member"))
    seen = intervals.withColumn("prev", F.max(reach).over(earlier)) \
        .where(F.col("from_version") < F.col("prev.end")).withColumn("from_us", micros("from_ts"))
    rows = _limited(seen, ["group", "topic", "queue", "from_version"])
    out = []
    for r in rows[:FINDINGS_PER_KIND_MAX]:
        out.append({"kind": "double_lock_holder", "group": r["group"], "topic": r["topic"], "queue": r["queue"],
                    "member": r["member"], "token": r["token"], "version": r["from_version"],
                    "at": iso(r["from_us"]), "other_member": r["prev"]["member"], "other_token": r["prev"]["token"],
                    "message": f"{r['group']} {r['topic']}/{r['queue']} granted to {r['member']} (token {r['token']}) "
                               f"at version {r['from_version']} while {r['prev']['member']} still held token "
                               f"{r['prev']['token']}"})
    return out + _more("double_lock_holder", rows)
