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


# What one event says of one segment; every event becomes a list of these (TopicCreated and TopicGrown one per queue).
FACT = (("queue", "int"), ("gen", "bigint"), ("opened", "boolean"), ("broker", "string"), ("physical_queue", "string"),
        ("physical_start", "bigint"), ("logic_start", "bigint"), ("budget_end", "bigint"), ("cause", "string"),
        ("from_broker", "string"), ("route_from", "timestamp"), ("route_from_version", "bigint"),
        ("written_from", "timestamp"), ("sealing_ts", "timestamp"), ("sealed_ts", "timestamp"),
        ("logic_end", "bigint"), ("physical_end", "bigint"), ("sealed_by", "string"))


def derive(mapping: DataFrame) -> DataFrame:
    """Segments of every topic in ``mapping`` (filter it by topic first to derive only those).

    One scan and one shuffle (by topic): each event becomes its facts before the shuffle, and every window after it
    is partitioned by topic and more, so the rows are already where the windows need them."""
    ev = parsed(mapping.where(F.col("type").isin(*EVENT_TYPES) & F.col("topic").isNotNull()), MAPPING_DATA)
    facts = ev.select("topic", "type", "version", "ts", F.explode(_facts()).alias("f")).select(
        "topic", "type", "version", "ts", *[F.col(f"f.{name}").alias(name) for name, _ in FACT])
    so_far = Window.partitionBy("topic").orderBy("version").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    created = F.when(F.col("type") == "TopicCreated", F.col("version"))
    facts = facts.withColumn("incarnation", F.last(created, ignorenulls=True).over(so_far)) \
        .where(F.col("incarnation").isNotNull())
    whole = Window.partitionBy("topic", "incarnation")
    deleted = F.col("type") == "TopicDeleted"
    facts = facts.withColumn("deleted_ts", F.min(F.when(deleted, F.col("ts"))).over(whole)) \
        .withColumn("deleted_version", F.min(F.when(deleted, F.col("version"))).over(whole))
    segment = Window.partitionBy(*KEY)
    for name in ("logic_start", "written_from", "sealing_ts", "sealed_ts"):
        facts = facts.withColumn(name, F.min(name).over(segment))
    for name in ("logic_end", "physical_end", "sealed_by", "budget_end"):
        facts = facts.withColumn(name, F.max(name).over(segment))
    chain = Window.partitionBy("topic", "incarnation", "queue").orderBy("gen", "route_from_version")
    return facts.where(F.col("opened")).select(
        *[c for c in COLUMNS if c not in ("route_to", "route_to_version", "written_to")],
        F.coalesce(F.lead("route_from").over(chain), "deleted_ts").alias("route_to"),
        F.coalesce(F.lead("route_from_version").over(chain), "deleted_version").alias("route_to_version"),
        F.coalesce(F.least("sealing_ts", "sealed_ts"), "deleted_ts").alias("written_to"),
    ).select(*COLUMNS)


def _fact(**values: Column) -> Column:
    return F.struct(*[(values[name] if name in values else F.lit(None)).cast(kind).alias(name) for name, kind in FACT])


def _facts() -> Column:
    """The facts of one event: gen 0 of each queue a TopicCreated or TopicGrown lists; else one fact of its segment
    (none but the keys for the events that change no segment: TopicDeleted)."""
    t, d = F.col("type"), "d."

    def on(kind: str, value: str) -> Column:
        return F.when(t == kind, F.col(value))
    first = F.transform(F.col("d.segments"), lambda s: _fact(
        queue=s["queue"], gen=F.lit(0), opened=F.lit(True), broker=s["broker"], physical_queue=s["physical_queue"],
        physical_start=F.lit(0), logic_start=F.lit(0), budget_end=s["budget_end"],
        cause=F.when(t == "TopicCreated", "create").otherwise("grow"), route_from=F.col("ts"),
        route_from_version=F.col("version"), written_from=F.col("ts")))
    opened = t == "SegmentOpened"
    one = F.array(_fact(
        queue=F.col("queue"), gen=F.col("gen"), opened=opened, broker=on("SegmentOpened", "broker"),
        physical_queue=on("SegmentOpened", d + "physical_queue"),
        physical_start=on("SegmentOpened", d + "physical_start"),
        budget_end=F.coalesce(on("SegmentOpened", d + "budget_end"), on("OffsetBudgetGranted", d + "budget_end")),
        cause=on("SegmentOpened", d + "cause"), from_broker=on("SegmentOpened", d + "from_broker"),
        route_from=on("SegmentOpened", "ts"), route_from_version=on("SegmentOpened", "version"),
        logic_start=on("LogicStartDecided", d + "logic_start"), written_from=on("LogicStartDecided", "ts"),
        sealing_ts=on("SegmentSealing", "ts"), sealed_ts=on("SegmentSealed", "ts"),
        logic_end=on("SegmentSealed", d + "logic_end"), physical_end=on("SegmentSealed", d + "physical_end"),
        sealed_by=on("SegmentSealed", d + "by")))
    return F.when(t.isin("TopicCreated", "TopicGrown"), first).otherwise(one)
