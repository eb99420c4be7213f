"""OpenLineage run events for the job (``python -m ops.lineage.job --format openlineage``): a START before it reads the
export and a COMPLETE (or FAIL) after, one JSON document a line, for a lineage backend (Marquez, DataHub, ...) to take
in. Plain dicts in the shape of the OpenLineage 2-0-2 spec; no client library needed.

Datasets are named as OpenLineage's naming spec says: a local path is namespace ``file`` and its absolute path;
``s3a://bucket/key`` (or ``s3://``) is ``s3://bucket`` and ``key``; any other ``scheme://authority/path`` is
``scheme://authority`` and ``/path``.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

PRODUCER = "https://github.com/stator/stator/tree/main/ops/lineage"
SPEC = "https://openlineage.io/spec"
RUN_EVENT_SCHEMA = f"{SPEC}/2-0-2/OpenLineage.json#/$defs/RunEvent"
SCHEMA_FACET = f"{SPEC}/facets/1-1-1/SchemaDatasetFacet.json#/$defs/SchemaDatasetFacet"
STATS_FACET = f"{SPEC}/facets/1-0-2/OutputStatisticsOutputDatasetFacet.json#/$defs/OutputStatisticsOutputDatasetFacet"
JOB_NAMESPACE = "stator"


def dataset(uri: str, fields: list[tuple[str, str]] | None = None, rows: int | None = None) -> dict[str, Any]:
    """A dataset of a run event; ``fields`` are (name, type) of its schema, ``rows`` what an output holds."""
    parts = urlsplit(uri)
    if not parts.scheme or parts.scheme == "file" or len(parts.scheme) == 1:   # a local path (or a Windows drive)
        namespace, name = "file", os.path.abspath(parts.path if parts.scheme == "file" else uri)
    elif parts.scheme in ("s3", "s3a", "s3n"):
        namespace, name = f"s3://{parts.netloc}", parts.path.lstrip("/")
    else:
        namespace, name = f"{parts.scheme}://{parts.netloc}", parts.path
    out: dict[str, Any] = {"namespace": namespace, "name": name, "facets": {}}
    if fields is not None:
        out["facets"]["schema"] = {"_producer": PRODUCER, "_schemaURL": SCHEMA_FACET,
                                   "fields": [{"name": n, "type": t} for n, t in fields]}
    if rows is not None:
        out["outputFacets"] = {"outputStatistics": {"_producer": PRODUCER, "_schemaURL": STATS_FACET,
                                                    "rowCount": rows}}
    return out


def run_event(event_type: str, run_id: str, job: str, inputs: list[dict[str, Any]],
              outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """``event_type``: START, COMPLETE or FAIL."""
    return {"eventType": event_type, "eventTime": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "run": {"runId": run_id, "facets": {}}, "job": {"namespace": JOB_NAMESPACE, "name": job, "facets": {}},
            "inputs": inputs, "outputs": outputs, "producer": PRODUCER, "schemaURL": RUN_EVENT_SCHEMA}
