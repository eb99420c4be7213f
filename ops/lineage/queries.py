"""The four lineage questions, each answered as the ``--json`` document of API.md ("Mapping history for Spark").

Each query filters the events by its keys (typed columns, before any JSON is parsed) and derives only the intervals it
needs. Where events meet intervals it is a join on the equality keys (topic, queue) plus the range condition:
open-source Spark has no range-join optimisation, and the equality keys keep the join from becoming a cartesian one.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from . import lock_intervals, segments
from .errors import LineageError
from .tables import MAPPING_DATA, Export, micros, parsed
from wire.times import iso


def locate_many(segs: DataFrame, probes: DataFrame) -> DataFrame:
    """Each probe ``(topic, queue, offset)`` with the segment of its topic's newest incarnation that held that logic
    offset (nulls where none did). An open segment holds at most what its broker's budget lets it write."""
    newest = segs.withColumn("_newest", F.max("incarnation").over(Window.partitionBy("topic"))) \
        .where(F.col("incarnation") == F.col("_newest")).alias("s")
    p = probes.alias("p")
    end = F.coalesce(F.col("s.logic_end"), F.col("s.logic_start") + F.col("s.budget_end") - F.col("s.physical_start"))
    held = (F.col("p.topic") == F.col("s.topic")) & (F.col("p.queue") == F.col("s.queue")) & \
        (F.col("s.logic_start") <= F.col("p.offset")) & (F.col("p.offset") < end)
    return p.join(newest, held, "left").select(
        "p.topic", "p.queue", "p.offset", "s.broker", "s.physical_queue",
        (F.col("p.offset") - F.col("s.logic_start") + F.col("s.physical_start")).alias("physical_offset"),
        "s.gen", F.col("s.written_from").alias("from"), F.col("s.written_to").alias("to"))


def locate(spark: SparkSession, export: Export, topic: str, queue: int, offset: int) -> dict[str, Any]:
    segs = segments.derive(export.mapping.where(F.col("topic") == topic))
    probe = spark.createDataFrame([(topic, queue, offset)], "topic string, queue int, offset bigint")
    rows = locate_many(segs, probe).select("*", micros("from").alias("from_us"), micros("to").alias("to_us")).collect()
    found = [r for r in rows if r["broker"] is not None]
    if not found:
        _topic_must_exist(export, topic)
        raise LineageError("OFFSET_NOT_FOUND", f"no segment of {topic!r} queue {queue} held logic offset {offset} "
                           "(not written yet, or the queue does not exist)")
    r = found[0]
    end = _end_when_exported(export, topic, queue)
    if end is not None and offset >= end["max_offset"]:
        # The log grants offset budgets and never hears of writes: the head's budget reaches far past its last message
        raise LineageError("OFFSET_NOT_FOUND", f"{topic!r} queue {queue} ended at logic offset {end['max_offset']} "
                           f"when the export ran ({iso(end['observed_us'])}, route version {end['route_version']}): "
                           f"offset {offset} was not written by then")
    return {"topic": topic, "queue": queue, "offset": offset, "broker": r["broker"],
            "physical_queue": r["physical_queue"], "physical_offset": r["physical_offset"], "gen": r["gen"],
            "from": iso(r["from_us"]), "to": iso(r["to_us"])}


def _end_when_exported(export: Export, topic: str, queue: int) -> dict[str, Any] | None:
    """The queue's end as its head broker told the last export run (schema.py ``queue_ends``), None when unknown."""
    if export.ends is None:
        return None
    rows = export.ends.where((F.col("topic") == topic) & (F.col("queue") == queue)) \
        .select("max_offset", micros("observed").alias("observed_us"), "route_version").limit(1).collect()
    return rows[0].asDict() if rows else None


def route_at(export: Export, topic: str, at_us: int) -> dict[str, Any]:
    at = F.timestamp_micros(F.lit(at_us))
    segs = segments.derive(export.mapping.where(F.col("topic") == topic))
    rows = segs.where((F.col("route_from") <= at) & (F.col("route_to").isNull() | (at < F.col("route_to")))) \
        .select("queue", "broker", "physical_queue", "gen").orderBy("queue").collect()
    if not rows:
        _topic_must_exist(export, topic)
        raise LineageError("TOPIC_NOT_FOUND", f"topic {topic!r} did not exist at {iso(at_us)}")
    return {"topic": topic, "at": iso(at_us), "queues": [r.asDict() for r in rows]}


def moves(export: Export, topic: str | None = None, broker: str | None = None,
          since_us: int | None = None) -> dict[str, Any]:
    ev = export.mapping.where(F.col("type") == "SegmentOpened")
    if topic is not None:
        ev = ev.where(F.col("topic") == topic)
    if since_us is not None:
        ev = ev.where(F.col("ts") >= F.timestamp_micros(F.lit(since_us)))
    ev = parsed(ev, MAPPING_DATA).where(F.col("d.cause") == "remap")
    if broker is not None:
        ev = ev.where((F.col("d.from_broker") == broker) | (F.col("broker") == broker))
    rows = ev.select("topic", "queue", F.col("d.from_broker").alias("from"), F.col("broker").alias("to"), "gen",
                     "version", micros("ts").alias("ts_us")).orderBy("version", "queue").collect()
    return {"moves": [{"topic": r["topic"], "queue": r["queue"], "from": r["from"], "to": r["to"], "gen": r["gen"],
                       "version": r["version"], "ts": iso(r["ts_us"])} for r in rows]}


def locks(export: Export, group: str, topic: str | None = None, queue: int | None = None) -> dict[str, Any]:
    ev = export.locks.where(F.col("group") == group)
    if topic is not None:
        ev = ev.where(F.col("topic") == topic)
    if queue is not None:
        ev = ev.where(F.col("queue") == queue)
    rows = lock_intervals.derive(ev).select(
        "group", "topic", "queue", "member", "token", "from_version", micros("from_ts").alias("from_us"),
        micros("to_ts").alias("to_us")).orderBy("from_version", "token").collect()
    if not rows and export.locks.where(F.col("group") == group).limit(1).count() == 0:
        raise LineageError("GROUP_NOT_FOUND", f"no event of group {group!r} in the export")
    return {"locks": [{"group": r["group"], "topic": r["topic"], "queue": r["queue"], "member": r["member"],
                       "token": r["token"], "from": iso(r["from_us"]), "to": iso(r["to_us"])} for r in rows]}


def _topic_must_exist(export: Export, topic: str) -> None:
    created = export.mapping.where((F.col("topic") == topic) & (F.col("type") == "TopicCreated"))
    if created.limit(1).count() == 0:
        raise LineageError("TOPIC_NOT_FOUND", f"no topic {topic!r} in the export")
