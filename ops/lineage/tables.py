"""An export (meta/export/schema.py has its layout) as two Spark DataFrames, and the fields lineage reads from each
event's JSON ``data``.

The typed columns (version, ts, type, topic, queue, gen, broker / group, member, token, reason) are what queries filter
and join on; ``data`` is parsed only for the rows that are left, with one schema per table naming just the fields
lineage uses (meta/events.py documents them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pyarrow as pa
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from meta.export import schema

from .errors import LineageError

# Fields of mapping events' data (TopicCreated and TopicGrown list their gen-0 segments).
MAPPING_DATA = ("physical_queue string, physical_start bigint, physical_end bigint, logic_start bigint, "
                "logic_end bigint, budget_end bigint, from_broker string, cause string, by string, "
                "segments array<struct<queue: int, broker: string, physical_queue: string, budget_end: bigint>>")
LOCK_DATA = "target string"


@dataclass
class Export:
    mapping: DataFrame     # mapping_events
    locks: DataFrame       # lock_events
    ends: DataFrame | None = None   # queue_ends: each queue's end when the export last ran (None: not in this export)


def missing_locally(data: str) -> bool:
    """True when ``data`` is a local directory holding neither table: said at once, before a JVM starts."""
    if "://" in data and not data.startswith("file://"):
        return False
    path = data[len("file://"):] if data.startswith("file://") else data
    return not any(os.path.isdir(os.path.join(path, t)) for t in (schema.MAPPING, schema.LOCKS))


def read(spark: SparkSession, data: str) -> Export:
    base = data.rstrip("/")
    tables = {t: _read_table(spark, f"{base}/{t}", schema.SCHEMAS[t]) for t in (schema.MAPPING, schema.LOCKS)}
    if all(df is None for df in tables.values()):
        raise no_export(data)
    return Export(*(df if df is not None else spark.createDataFrame([], spark_schema(t)) for t, df in tables.items()),
                  # An export written without a meta node (``exporter.write_stored``) has no queue ends
                  ends=_read_table(spark, f"{base}/{schema.ENDS}", schema.ENDS_SCHEMA))


def no_export(data: str) -> LineageError:
    return LineageError("EXPORT_NOT_FOUND", f"no export at {data} (neither {schema.MAPPING}/ nor {schema.LOCKS}/ in "
                        "it; `stator export --endpoints URL --out DIR` makes one)")


def spark_schema(table: str):
    return from_arrow_schema(schema.SCHEMAS[table])


def _read_table(spark: SparkSession, path: str, columns: pa.Schema) -> DataFrame | None:
    """The table at ``path`` with ``columns`` (the export's schema), None when the export has none."""
    try:
        df = spark.read.parquet(path)
        # Spark Connect reads lazily: without asking for the schema here, a missing path would fail the first query.
        df.schema
    except AnalysisException as e:
        if e.getCondition() == "PATH_NOT_FOUND":
            return None
        raise
    # The day partition is for pruning by whoever reads the files; lineage keys on versions and times.
    return df.select(*[f.name for f in columns])


def parsed(df: DataFrame, ddl: str) -> DataFrame:
    """``df`` with its JSON ``data`` as the struct column ``d``."""
    return df.withColumn("d", F.from_json("data", ddl))


def micros(col: str | Column) -> Column:
    """A timestamp as microseconds since the epoch (times.py says why)."""
    return F.unix_micros(F.col(col) if isinstance(col, str) else col)
