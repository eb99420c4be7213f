"""The Spark job that writes the derived tables next to an export, for other Spark users:
``<out>/segments/`` and ``<out>/lock_intervals/`` (Parquet, replaced whole on every run; ``out`` defaults to the
export itself). Columns: ops/lineage/segments.py and ops/lineage/lock_intervals.py.

    python -m ops.lineage.job --data DIR [--out DIR] [--master URL | --remote sc://...] [--format openlineage]
    spark-submit --master spark://host:7077 ops/lineage/job.py --data s3a://bucket/stator-export

It uses DataFrame functions only (no Python UDFs), so executors need nothing of Stator; the driver needs Stator
installed (``pip install 'stator[spark]'``). Prints one JSON line: the tables written and their row counts; with
``--format openlineage``, OpenLineage run events instead (ops/lineage/openlineage.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Sequence

SEGMENTS = "segments"
LOCK_INTERVALS = "lock_intervals"


def write_derived(spark, data: str, out: str | None = None) -> dict[str, int]:
    from ops.lineage import lock_intervals, segments, tables
    export = tables.read(spark, data)
    base = (out or data).rstrip("/")
    counts = {}
    derived = {SEGMENTS: segments.derive(export.mapping), LOCK_INTERVALS: lock_intervals.derive(export.locks)}
    for name, df in derived.items():
        df.write.mode("overwrite").parquet(f"{base}/{name}")
        counts[name] = spark.read.parquet(f"{base}/{name}").count()
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ops.lineage.job", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="the export (a directory or s3a://, hdfs:// URI)")
    parser.add_argument("--out", help="where to write the derived tables (default: next to the export)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--master", help="a Spark master; default: spark-submit's, else local[*]")
    where.add_argument("--remote", help="Spark Connect, sc://host:port")
    parser.add_argument("--format", choices=("summary", "openlineage"), default="summary",
                        help="summary: one JSON line of counts; openlineage: run events START and COMPLETE (or FAIL)")
    args = parser.parse_args(argv)
    from ops.lineage.errors import LineageError, packages_needed
    try:
        with packages_needed():
            return _run(args)
    except LineageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    # Imported here, not at the top: under packages_needed, a missing pyarrow or pyspark is the one-line error.
    from meta.export import schema
    from ops.lineage import openlineage, session, tables
    from ops.lineage.errors import LineageError
    out = (args.out or args.data).rstrip("/")
    run_id = str(uuid.uuid4())
    inputs = [openlineage.dataset(f"{args.data.rstrip('/')}/{t}", _fields(tables.spark_schema(t)))
              for t in (schema.MAPPING, schema.LOCKS)]

    def said(event_type: str, outputs: list) -> None:
        if args.format == "openlineage":
            print(json.dumps(openlineage.run_event(event_type, run_id, "stator-lineage-job", inputs, outputs)))
    said("START", [openlineage.dataset(f"{out}/{name}") for name in (SEGMENTS, LOCK_INTERVALS)])
    try:
        if args.remote is None and tables.missing_locally(args.data):   # a Connect server reads its own disks
            raise tables.no_export(args.data)
        spark = session.build(master=args.master, remote=args.remote, app_name="stator-lineage-job")
        counts = write_derived(spark, args.data, args.out)
    except LineageError:
        said("FAIL", [])
        raise
    said("COMPLETE", [openlineage.dataset(f"{out}/{name}", _fields(spark.read.parquet(f"{out}/{name}").schema), n)
                      for name, n in counts.items()])
    if args.format == "summary":
        print(json.dumps({"out": (args.out or args.data), **counts}))
    return 0


def _fields(struct) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in struct.fields]


if __name__ == "__main__":
    sys.exit(main())
