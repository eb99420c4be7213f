"""One lineage command from request to answer: the CLI parses into a ``Request``, ``answer`` runs it on Spark.

The export's absence on a local disk is said before any JVM starts (unless Spark Connect reads it, on the server's
disks); everything else needs the session. A package of the `spark` extra that is missing is one coded error whatever
the master (ops/lineage/errors.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

COMMANDS = ("locate", "route-at", "moves", "locks", "verify")


@dataclass
class Request:
    command: str                   # one of COMMANDS
    data: str                      # the export: a directory or a URI Spark reads (s3a://, hdfs://)
    master: str | None = None
    remote: str | None = None      # Spark Connect, sc://host:port
    args: dict[str, Any] = field(default_factory=dict)   # the command's own options, by name


def answer(request: Request) -> Any:
    from .errors import packages_needed
    if request.command not in COMMANDS:
        raise ValueError(request.command)
    with packages_needed():
        from . import tables
        # A Spark Connect server reads the export from its own disks: only it can say that a path holds none.
        if request.remote is None and tables.missing_locally(request.data):
            raise tables.no_export(request.data)
        from . import session
        spark = session.build(master=request.master, remote=request.remote)
        return run_on(spark, request)


def run_on(spark, request: Request) -> Any:
    from . import queries, tables, verify
    export = tables.read(spark, request.data)
    a = request.args
    if request.command == "locate":
        return queries.locate(spark, export, a["topic"], a["queue"], a["offset"])
    if request.command == "route-at":
        return queries.route_at(export, a["topic"], a["at"])
    if request.command == "moves":
        return queries.moves(export, a.get("topic"), a.get("broker"), a.get("since"))
    if request.command == "locks":
        return queries.locks(export, a["group"], a.get("topic"), a.get("queue"))
    return verify.findings(export, request.data)
