"""``stator export``: the log's history, appended to Parquet for Spark (meta/export/schema.py has the layout).

Incremental and idempotent, whatever interrupts it:
- events go to files by fixed ranges of versions (CHUNK_VERSIONS each), named by the range, one file per table and
  UTC day: ``<table>/day=YYYY-MM-DD/part-<first>-<last>.parquet``. A run starts again at the beginning of the range
  holding the last exported version and rewrites that range's files whole, so a file is replaced, never duplicated;
- every file is written under a temporary name and then moved into place; the state file
  (``_stator_export.json``: the last exported version) is replaced only after the data it covers;
- the history read must be contiguous (every version exactly once): a node whose history has a hole makes the
  export stop with an error naming the missing versions, instead of writing an export that silently lacks them;
- each run, with or without new events, then asks the broker holding each queue's head for the queue's end
  (``GET /v1/queues/{topic}``) and replaces ``queue_ends`` (schema.py says why); a broker that does not answer
  leaves its queues out, and the run says how many.

Works against any meta node (its history is the log's); ``out`` is a local directory or any URI pyarrow's filesystem
layer opens (``s3://``, ``hdfs://``; Spark's ``s3a://`` is the same bucket through ``s3://``).
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from wire.errors import StatorError
from wire.caller import MetaCaller
from wire.tls import connector

from . import schema

CHUNK_VERSIONS = 100_000          # versions per file range: the most a run re-reads and rewrites
HISTORY_PAGE_EVENTS = 10_000      # meta's HISTORY_PAGE_MAX
HISTORY_CALL_DEADLINE_S = 60.0
STATE_FILE = "_stator_export.json"
ENDS_FILE = "part.parquet"
BROKER_CALL_TIMEOUT_S = 10.0      # one broker's queue ends for one topic
BROKER_CONNECT_TIMEOUT_S = 2.0    # a head broker that is down (fenced, its host gone) costs this, not the whole call
TOPICS_IN_FLIGHT_MAX = 16        # topics whose queue ends are asked for at once
TOPICS_OBSERVED_MAX = 100_000     # topics whose queue ends one run asks for (meta's own bound on topics is lower)


class ExportError(RuntimeError):
    """The export cannot go on (a hole in the node's history, an unreadable state file, meta unreachable)."""


@dataclass
class ExportResult:
    exported_after: int      # the last version exported before this run
    last_version: int        # the last version exported now
    files: int               # files written (the range holding exported_after is rewritten whole)
    queue_ends: int = 0      # queues whose end a broker told this run (queue_ends)
    queues_unobserved: int = 0   # queues whose head broker did not answer

    @property
    def events(self) -> int:
        """Events this run added to the export."""
        return self.last_version - self.exported_after


def chunk_first(version: int) -> int:
    """The first version of the fixed range holding ``version`` (versions start at 1)."""
    return (version - 1) // CHUNK_VERSIONS * CHUNK_VERSIONS + 1


class Destination:
    """Where an export lives: a pyarrow filesystem and a base path on it."""

    def __init__(self, out: str, create: bool = True):
        if "://" in out:
            self.fs, self.base = pafs.FileSystem.from_uri(out)
        else:
            self.fs, self.base = pafs.LocalFileSystem(), os.path.abspath(out)
        if create:    # readers of an export (lineage verify) leave the filesystem as they found it
            self.fs.create_dir(self.base, recursive=True)

    def path(self, *parts: str) -> str:
        return "/".join([self.base.rstrip("/"), *parts])

    def last_version(self) -> int:
        try:
            with self.fs.open_input_stream(self.path(STATE_FILE)) as f:
                state = json.loads(f.read())
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as e:
            raise ExportError(f"the export's state file {self.path(STATE_FILE)} is unreadable: {e}") from None
        if not isinstance(state, dict) or not isinstance(state.get("last_version"), int):
            raise ExportError(f"the export's state file {self.path(STATE_FILE)} has no last_version")
        return state["last_version"]

    def write_state(self, last_version: int) -> None:
        body = json.dumps({"last_version": last_version, "schema_version": schema.SCHEMA_VERSION}).encode()
        self._replace(self.path(STATE_FILE), lambda tmp: self._write_bytes(tmp, body))

    def write_table(self, table: str, day: str, first: int, last: int, rows: list[dict[str, Any]]) -> None:
        directory = self.path(table, f"day={day}")
        self.fs.create_dir(directory, recursive=True)
        data = schema.arrow_table(table, rows)
        self._replace(f"{directory}/part-{first:012d}-{last:012d}.parquet",
                      lambda tmp: pq.write_table(data, tmp, filesystem=self.fs))

    def write_ends(self, rows: list[dict[str, Any]]) -> None:
        directory = self.path(schema.ENDS)
        self.fs.create_dir(directory, recursive=True)
        data = schema.ends_table(rows)
        self._replace(f"{directory}/{ENDS_FILE}", lambda tmp: pq.write_table(data, tmp, filesystem=self.fs))

    def _write_bytes(self, path: str, body: bytes) -> None:
        with self.fs.open_output_stream(path) as f:
            f.write(body)

    def _replace(self, final: str, write: Callable[[str], None]) -> None:
        # Readers (Spark lists the directory) skip names starting with "_" or ".": a half-written file is invisible.
        directory, name = final.rsplit("/", 1)
        tmp = f"{directory}/_tmp-{uuid.uuid4().hex}-{name}"
        try:
            write(tmp)
            self.fs.move(tmp, final)
        finally:
            try:
                self.fs.delete_file(tmp)
            except (FileNotFoundError, OSError):
                pass


async def export(meta_urls: Sequence[str], token: str | None, out: str,
                 progress: Callable[[int], None] | None = None,
                 ssl_context: ssl.SSLContext | None = None, consistency: str = "linearizable") -> ExportResult:
    """Append every event after the last exported version to ``out``; returns what was done. ``ssl_context``: for
    https:// meta URLs (the CA, and the client certificate under mutual TLS: wire/tls.py). ``consistency``: of the
    read that fixes how far the run goes (``_log_head``)."""
    dest = Destination(out)
    exported_after = dest.last_version()
    result = ExportResult(exported_after, exported_after, 0)
    async with MetaCaller(list(meta_urls), token, ssl_context=ssl_context) as meta:
        head = await _log_head(meta, consistency)
        await _export_events(meta, dest, result, head, progress)
        rows, result.queues_unobserved = await _queue_ends(meta, token, ssl_context)
        dest.write_ends(rows)
        result.queue_ends = len(rows)
    return result


async def _export_events(meta: MetaCaller, dest: Destination, result: ExportResult, head: int,
                         progress: Callable[[int], None] | None) -> None:
    first = chunk_first(result.exported_after + 1)
    if not await _read_range(meta, result.exported_after, result.exported_after + 1, head):
        return                          # nothing new: leave every event file as it is
    cursor = first - 1
    while True:
        last_of_chunk = first + CHUNK_VERSIONS - 1
        events = await _read_range(meta, cursor, last_of_chunk, head)
        if not events:
            return
        result.files += _write_chunk(dest, first, last_of_chunk, events)
        if progress is not None:
            progress(events[-1]["version"] - max(result.last_version, first - 1))
        result.last_version = events[-1]["version"]
        dest.write_state(result.last_version)
        if result.last_version < last_of_chunk:
            return                      # the log's head: the next run rewrites this range with what came since
        first, cursor = last_of_chunk + 1, last_of_chunk


async def _queue_ends(meta: MetaCaller, token: str | None, ssl_context: ssl.SSLContext | None
                      ) -> tuple[list[dict[str, Any]], int]:
    """Each queue's end from the broker holding its head, and how many queues no broker answered for."""
    try:
        topics = (await meta.call("GET", "/v1/topics", deadline_s=HISTORY_CALL_DEADLINE_S)).body["topics"]
    except StatorError as e:
        raise ExportError(f"the topics could not be listed: {e}") from None
    rows: list[dict[str, Any]] = []
    unobserved = 0
    gate = asyncio.Semaphore(TOPICS_IN_FLIGHT_MAX)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = aiohttp.ClientTimeout(total=BROKER_CALL_TIMEOUT_S, sock_connect=BROKER_CONNECT_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector(ssl_context), timeout=timeout) as http:

        async def one_topic(topic: dict[str, Any]) -> None:
            async with gate:   # a topic at a time per slot: its route, then its head brokers one after the other
                await observe(topic["topic"], topic["queues"])

        async def observe(name: str, queue_count: int) -> None:
            nonlocal unobserved
            try:
                route = (await meta.call("GET", f"/v1/routes/{name}", deadline_s=HISTORY_CALL_DEADLINE_S)).body
            except StatorError as e:
                if e.code != "TOPIC_NOT_FOUND":   # deleted since it was listed: nothing to observe
                    unobserved += queue_count
                return
            heads: dict[str, set[int]] = {}
            for q in route["queues"]:
                if q.get("address"):
                    heads.setdefault(q["address"], set()).add(q["queue"])
            unobserved += len(route["queues"]) - sum(len(qs) for qs in heads.values())
            for address, queues in heads.items():
                observed_ms = int(time.time() * 1000)
                try:
                    async with http.get(f"{address.rstrip('/')}/v1/queues/{name}", headers=headers) as r:
                        body = await r.json(content_type=None) if r.status == 200 else None
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
                    body = None
                listed = body.get("queues") if isinstance(body, dict) else None
                told = {q["queue"]: q["max_offset"] for q in (listed if isinstance(listed, list) else [])
                        if isinstance(q, dict) and q.get("queue") in queues and isinstance(q.get("max_offset"), int)}
                unobserved += len(queues) - len(told)
                rows.extend({"topic": name, "queue": q, "max_offset": end, "observed": observed_ms,
                             "route_version": route["version"]} for q, end in sorted(told.items()))
        await asyncio.gather(*(one_topic(t) for t in topics[:TOPICS_OBSERVED_MAX]))
    unobserved += sum(t["queues"] for t in topics[TOPICS_OBSERVED_MAX:])
    rows.sort(key=lambda r: (r["topic"], r["queue"]))
    return rows, unobserved


async def _log_head(meta: MetaCaller, consistency: str) -> int:
    """The log's version when the run starts: with a read barrier through the leader (linearizable), every write
    acknowledged before the run is exported, whichever node, maybe a lagging follower, answers the history reads
    (``min_version``); serializable, what the answering node applied (a cluster without a leader can be exported)."""
    try:
        answer = await meta.call("GET", "/v1/cluster", params={"consistency": consistency},
                                 deadline_s=HISTORY_CALL_DEADLINE_S)
    except StatorError as e:
        raise ExportError(f"the log's head could not be read: {e}") from None
    return answer.body["applied_version"]


async def _read_range(meta: MetaCaller, after: int, last: int, head: int) -> list[dict[str, Any]]:
    """Events after ``after`` up to ``last`` (inclusive), contiguous, from a node that applied ``head``."""
    events: list[dict[str, Any]] = []
    cursor = after
    while cursor < last:
        try:
            answer = await meta.call("GET", "/v1/history", params={
                "after": cursor, "limit": min(HISTORY_PAGE_EVENTS, last - cursor), "min_version": head},
                deadline_s=HISTORY_CALL_DEADLINE_S)
        except StatorError as e:
            raise ExportError(f"history after version {cursor} could not be read: {e}") from None
        page = answer.body["events"]
        if not page:
            break
        for e in page:
            if e["version"] != cursor + 1:
                raise ExportError(f"the history has no events {cursor + 1}..{e['version'] - 1}; export from another "
                                  "node, or fill that node's projection first")
            cursor = e["version"]
            events.append(e)
    return events


def _write_chunk(dest: Destination, first: int, last: int, events: list[dict[str, Any]]) -> int:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in events:
        table = schema.table_of(e)
        groups.setdefault((table, schema.day_of(e)), []).append(schema.row(table, e))
    for (table, day), rows in sorted(groups.items()):
        dest.write_table(table, day, first, last, rows)
    return len(groups)


def write_stored(out: str, events: Iterable[dict[str, Any]]) -> int:
    """Write stored events (the history API's shape, in version order) into ``out`` by the same ranges, files and state
    as ``export``; returns the files written. For exports made without a meta node (benchmarks, tests of readers):
    unlike ``export`` it takes the versions as given, holes included, so a reader's checks can be tried on them."""
    dest = Destination(out)
    files, chunk, first, last = 0, [], 0, 0
    for e in events:
        if chunk and chunk_first(e["version"]) != first:
            files += _write_chunk(dest, first, first + CHUNK_VERSIONS - 1, chunk)
            chunk = []
        if not chunk:
            first = chunk_first(e["version"])
        chunk.append(e)
        last = e["version"]
    if chunk:
        files += _write_chunk(dest, first, first + CHUNK_VERSIONS - 1, chunk)
    dest.write_state(last)
    return files


def run(meta_urls: Sequence[str], token: str | None, out: str,
        progress: Callable[[int], None] | None = None, ssl_context: ssl.SSLContext | None = None,
        consistency: str = "linearizable") -> ExportResult:
    return asyncio.run(export(meta_urls, token, out, progress, ssl_context, consistency))
