"""The ``segments`` table: one row per segment of a topic's incarnation, derived from mapping events with windows.

Each row holds three half-open intervals:
- logic offsets ``[logic_start, logic_end)``: logic offset L lives at physical offset ``L - logic_start +
  physical_start`` of ``physical_queue`` on ``broker``; ``logic_end`` is null while the segment is open (its writes are
  then bounded by ``budget_end``, the physical offset its broker may write up to);
- in the route ``[route_from, route_to)`` (times, and ``route_from_version``/``route_to_version``): from the event that
  opened it to the one that opened the next generation, or deleted the topic;
- written ``[written_from, written_to)``: from the time it became writable (its logic start decided; a generation 0 at
  once) to the start of its seal (or the seal itself when its broker's session had expired, or the topic's deletion).

A topic deleted and created again with the same name is another incarnation (the version of its TopicCreated, also
part of its physical queue names): every window is partitioned by it, so no interval bleeds across a deletion.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from .tables import MAPPING_DATA, parsed

EVENT_TYPES = ("TopicCreated", "TopicGrown", "TopicDeleted", "SegmentOpened", "SegmentSealing", "SegmentSealed",
               "LogicStartDecided", "OffsetBudgetGranted")
KEY = ("topic", "incarnation", "queue", "gen")
COLUMNS = ("topic", "incarnation", "queue", "gen", "broker", "physical_queue", "physical_start", "physical_end",
           "logic_start", "logic_end", "budget_end", "cause", "from_broker", "route_from", "route_from_version",
           "route_to", "route_to_version", "written_from", "written_to", "sealed_by")


def derive(mapping: DataFrame) -> DataFrame:
    """Segments of every topic in ``mapping`` (filter it by topic first to derive only those)."""
    ev = _with_incarnation(mapping.where(F.col("type").isin(*EVENT_TYPES) & F.col("topic").isNotNull()))
    facts = _opened(ev).unionByName(_changed(ev), allowMissingColumns=True)
    segment = Window.partitionBy(*KEY)
    for name in ("logic_start", "written_from", "sealing_ts", "sealed_ts"):
        facts = facts.withColumn(name, F.min(name).over(segment))
    for name in ("logic_end", "physical_end", "sealed_by", "budget_end"):
        facts = facts.withColumn(name, F.max(name).over(segment))
    segs = facts.where(F.col("opened"))
    chain = Window.partitionBy("topic", "incarnation", "queue").orderBy("gen", "route_from_version")
    return segs.select(
        *[c for c in COLUMNS if c not in ("route_to", "route_to_version", "written_to")],
        F.coalesce(F.lead("route_from").over(chain), "deleted_ts").alias("route_to"),
        F.coalesce(F.lead("route_from_version").over(chain), "deleted_version").alias("route_to_version"),
        F.coalesce(F.least("sealing_ts", "sealed_ts"), "deleted_ts").alias("written_to"),
    ).select(*COLUMNS)


def _with_incarnation(ev: DataFrame) -> DataFrame:
    """Each event with the version of the TopicCreated before it (its topic's incarnation) and that incarnation's end."""
    so_far = Window.partitionBy("topic").orderBy("version").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    created = F.when(F.col("type") == "TopicCreated", F.col("version"))
    ev = ev.withColumn("incarnation", F.last(created, ignorenulls=True).over(so_far)).where(F.col("incarnation").isNotNull())
    whole = Window.partitionBy("topic", "incarnation")
    deleted = F.col("type") == "TopicDeleted"
    return parsed(ev, MAPPING_DATA) \
        .withColumn("deleted_ts", F.min(F.when(deleted, F.col("ts"))).over(whole)) \
        .withColumn("deleted_version", F.min(F.when(deleted, F.col("version"))).over(whole))


def _opened(ev: DataFrame) -> DataFrame:
    """One row per segment as it was opened: gen 0 of each queue created or grown, and every SegmentOpened."""
    common = [F.col("topic"), F.col("incarnation"), F.col("deleted_ts"), F.col("deleted_version"),
              F.col("ts").alias("route_from"), F.col("version").alias("route_from_version"), F.lit(True).alias("opened")]
    first = ev.where(F.col("type").isin("TopicCreated", "TopicGrown")) \
        .select(*common, F.explode("d.segments").alias("s"), F.col("type")) \
        .select("topic", "incarnation", "deleted_ts", "deleted_version", "route_from", "route_from_version", "opened",
                F.col("s.queue").alias("queue"), F.lit(0).cast("bigint").alias("gen"), F.col("s.broker").alias("broker"),
                F.col("s.physical_queue").alias("physical_queue"), F.lit(0).cast("bigint").alias("physical_start"),
                F.lit(0).cast("bigint").alias("logic_start"), F.col("s.budget_end").alias("budget_end"),
                F.when(F.col("type") == "TopicCreated", "create").otherwise("grow").alias("cause"),
                F.lit(None).cast("string").alias("from_broker"), F.col("route_from").alias("written_from"))
    later = ev.where(F.col("type") == "SegmentOpened").select(
        *common, "queue", "gen", "broker", F.col("d.physical_queue").alias("physical_queue"),
        F.col("d.physical_start").alias("physical_start"), F.col("d.budget_end").alias("budget_end"),
        F.col("d.cause").alias("cause"), F.col("d.from_broker").alias("from_broker"))
    return first.unionByName(later, allowMissingColumns=True)


def _changed(ev: DataFrame) -> DataFrame:
    """What later events say of a segment: its logic start, its seal, its budget."""
    t = F.col("type")

    def on(kind: str, value: Column | str) -> Column:
        return F.when(t == kind, value if isinstance(value, Column) else F.col(value))
    return ev.where(t.isin("LogicStartDecided", "SegmentSealing", "SegmentSealed", "OffsetBudgetGranted")).select(
        "topic", "incarnation", "queue", "gen", F.lit(False).alias("opened"),
        on("LogicStartDecided", "d.logic_start").alias("logic_start"),
        on("LogicStartDecided", "ts").alias("written_from"),
        on("SegmentSealing", "ts").alias("sealing_ts"),
        on("SegmentSealed", "ts").alias("sealed_ts"),
        on("SegmentSealed", "d.logic_end").alias("logic_end"),
        on("SegmentSealed", "d.physical_end").alias("physical_end"),
        on("SegmentSealed", "d.by").alias("sealed_by"),
        on("OffsetBudgetGranted", "d.budget_end").alias("budget_end"))
