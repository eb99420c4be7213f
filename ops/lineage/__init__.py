"""Lineage of an export on Spark (``stator lineage``, ``python -m ops.lineage.job``): DataFrame and SQL functions only,
no RDDs and no Python UDFs, so the same code runs on a local session, under ``spark-submit`` on any master, or through
Spark Connect, and executors need none of Stator's code.

- ``tables``: the export's two event tables as DataFrames, and the fields of each event's JSON;
- ``segments`` and ``lock_intervals``: the derived tables, half-open intervals made with window functions;
- ``queries``: locate, route-at, moves and locks, answered in the ``--json`` shapes of API.md;
- ``verify``: what an export must never show (version gaps, overlapping segments, two lock holders at once);
- ``session``, ``output``, ``errors``: the session builder, answers for people, coded errors (times: ``ops/times.py``);
- ``job``: the entry point that writes ``segments/`` and ``lock_intervals/`` as Parquet next to the export.
"""
