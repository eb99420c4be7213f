"""Export rate and lineage query times on Spark, over synthetic histories.

    python -m ops.bench.lineage [--events 1000000] [--query-events 10000000] [--topics 1000] [--queues 8]

1. Export: ``--events`` events, made by ops/bench/lineage_events.py (budget grants, graceful remaps, lock grants,
   revocations and releases over ``--topics`` topics of ``--queues`` queues, 10 brokers, 100 groups) and written by
   the exporter's own writer (meta/export ``write_stored``: rows, Arrow tables, Parquet files, state), one range of
   CHUNK_VERSIONS at a time; the time counted is the writer's only, not the making of the events.
2. Queries: an export of ``--query-events`` events made the same way, then on a ``local[2]`` session each lineage
   query once, timed after the session started: locate, route-at, moves of a topic, moves of a broker since a time,
   locks of a group, and verify (which also must find nothing: the synthetic history is sound).
Targets (issue 8): export of 1,000,000 events under 30 s; each query under 20 s on 10,000,000 events.
Prints one JSON object; progress and the machine's load go to stderr.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from meta.export import exporter
from ops.bench.common import emit, loadavg, say
from ops.bench.lineage_events import BUDGET, History

BROKERS = [f"b{i}" for i in range(10)]
GROUPS = 100
MEMBERS = 8
SEED = 8


class Synthetic:
    """A sound history of ``total`` events, made as it is written (ten million events never sit in memory at once)."""

    def __init__(self, total: int, topics: int, queues: int, seed: int = SEED):
        self.total, self.topics, self.queues = total, topics, queues
        self.rnd = random.Random(seed)
        self.history = History(step_ms=1)
        self.first_ts_ms = self.history.ts
        self.budgets: dict[tuple[str, int], int] = {}
        self.holders: dict[tuple[str, str, int], tuple[str, int]] = {}

    def chunks(self) -> Iterator[list[dict[str, Any]]]:
        """The events in lists that each fill one export range (CHUNK_VERSIONS versions), the last one partly."""
        h = self.history
        for b in BROKERS:
            h.add("BrokerRegistered", broker=b, address=f"http://{b}:7150", zone=None, cluster="DefaultCluster",
                  disk=None, epoch=1)
        for t in range(self.topics):
            h.create_topic(f"topic{t}", BROKERS[t % len(BROKERS):] + BROKERS[:t % len(BROKERS)], self.queues)
        pending: list[dict[str, Any]] = []
        while True:
            pending += [e for e in h.events if e["version"] <= self.total]
            h.events = []
            while pending and pending[-1]["version"] >= _range_end(pending[0]["version"]):
                end = _range_end(pending[0]["version"])
                yield [e for e in pending if e["version"] <= end]
                pending = [e for e in pending if e["version"] > end]
            if h.version >= self.total:
                break
            self._step()
        if pending:
            yield pending

    def _step(self) -> None:
        h, rnd = self.history, self.rnd
        topic, q = f"topic{rnd.randrange(self.topics)}", rnd.randrange(self.queues)
        r = rnd.random()
        if r < 0.4:
            self.budgets[topic, q] = self.budgets.get((topic, q), BUDGET) + BUDGET
            h.budget(topic, q, self.budgets[topic, q])
        elif r < 0.8:
            here = h.topics[topic]["heads"][q]["broker"]
            h.remap(topic, q, rnd.choice([b for b in BROKERS if b != here]), written=rnd.randrange(1, 10_000))
            self.budgets.pop((topic, q), None)
        else:
            key = (f"group{rnd.randrange(GROUPS)}", topic, q)
            if key in self.holders:
                member, token = self.holders.pop(key)
                h.target(*key, member, token, f"m{rnd.randrange(MEMBERS)}")
                h.release(*key, member, token, reason=rnd.choice(("released", "left", "lease_expired")))
            else:
                member = f"m{rnd.randrange(MEMBERS)}"
                self.holders[key] = (member, h.grant(*key, member))


def _range_end(version: int) -> int:
    return exporter.chunk_first(version) + exporter.CHUNK_VERSIONS - 1


def export(out: str, history: Synthetic) -> dict[str, Any]:
    written = files = 0
    writer_s = 0.0
    started = time.monotonic()
    for chunk in history.chunks():
        t0 = time.monotonic()
        files += exporter.write_stored(out, chunk)
        writer_s += time.monotonic() - t0
        written += len(chunk)
        if written % 1_000_000 < len(chunk):
            say(f"exported {written:,} events, writer {writer_s:.1f} s, load {loadavg()}")
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
    return {"events": written, "files": files, "writer_s": round(writer_s, 2),
            "events_per_s": round(written / writer_s) if writer_s else None,
            "with_generation_s": round(time.monotonic() - started, 2), "bytes": size, "load": loadavg()}


def queries(out: str, history: Synthetic) -> dict[str, Any]:
    from ops.lineage import queries as q
    from ops.lineage import session, tables, verify
    t0 = time.monotonic()
    spark = session.build("local[2]", conf={"spark.sql.shuffle.partitions": "8", "spark.driver.memory": "2g"})
    result: dict[str, Any] = {"session_start_s": round(time.monotonic() - t0, 2)}
    export_ = tables.read(spark, out)
    first_us, last_us = history.first_ts_ms * 1000, history.history.ts * 1000
    head = history.history.topics["topic7"]["heads"][3]
    asks = {
        "locate": lambda: q.locate(spark, export_, "topic7", 3, head["logic_start"]),
        "route_at": lambda: q.route_at(export_, "topic7", (first_us + last_us) // 2),
        "moves_topic": lambda: q.moves(export_, topic="topic7"),
        "moves_broker_since": lambda: q.moves(export_, broker="b3", since_us=last_us - 60_000_000),
        "locks_group": lambda: q.locks(export_, "group3"),
        "verify": lambda: verify.findings(export_, out),
    }
    for name, ask in asks.items():
        t0 = time.monotonic()
        answer = ask()
        took = time.monotonic() - t0
        rows = len(answer) if isinstance(answer, list) else \
            len(next((v for v in answer.values() if isinstance(v, list)), [None]))
        result[name] = {"s": round(took, 2), "rows": rows, "load": loadavg()}
        say(f"{name}: {took:.1f} s, {rows} rows, load {loadavg()}")
    assert result["verify"]["rows"] == 0, "the synthetic history is sound: verify must find nothing"
    spark.stop()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="events for the export rate")
    ap.add_argument("--query-events", type=int, default=10_000_000, help="events the queries run over")
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--keep", action="store_true", help="keep the exports (their paths are printed)")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="stator-bench-lineage-")
    try:
        say(f"export of {args.events:,} events into {base}/rate")
        rate = export(f"{base}/rate", Synthetic(args.events, args.topics, args.queues))
        shutil.rmtree(f"{base}/rate", ignore_errors=True)
        say(f"export of {args.query_events:,} events for the queries")
        history = Synthetic(args.query_events, args.topics, args.queues)
        data = export(f"{base}/queries", history)
        emit({"bench": "lineage", "cpus": os.cpu_count(), "export": rate, "query_data": data,
              "queries": queries(f"{base}/queries", history), **({"kept": base} if args.keep else {})})
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
