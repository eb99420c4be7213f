"""The projection writer alone: the CPU one stored event costs the process each meta node forks for its SQL projection.

    python -m ops.bench.projection_writer [--events 50000] [--batch 500] [--rounds 3] [--kinds config,budget,lock]

No cluster: stored events as the image keeps them (canonical JSON lines, meta/image.py), fed to a fresh SQLite file
projection in batches as the follower sends them (meta/projection_follower.py: everything applied since the last
batch, 0.2 s apart; ``--batch`` stands for that) through the call the writer process makes for each batch.
Kinds: ``config``, the write of ``ops.bench.vs_etcd`` (SetTopicConfig of one key, a distinct value each, through the
state machine: TopicConfigChanged, folded into the topic's row); ``budget``, OffsetBudgetGranted over the topic's 4
queues (folded into a segment's row); ``lock``, LockGranted and LockReleased in turn (kept in history only).
Each round starts on an empty database with the topic (4 queues) and its brokers in it. Prints one JSON object:
CPU microseconds per event (time.process_time over the applies only), the best and the median of ``--rounds``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator

from meta.events import make, stored
from meta.projection import SqlProjection
from meta.state_machine import StateMachine
from wire.json_body import canonical

from .common import emit, loadavg, say

TOPIC = "p"
QUEUES = 4
BROKERS = ("b1", "b2", "b3")
KINDS = ("config", "budget", "lock")


def _send(sm: StateMachine, i: int, cmd: dict) -> None:
    outcome, _changed = sm.apply({"rid": f"r{i}", "ts": 2_000_000 + i, "budget": 1000, "actor": "admin", "cmd": cmd})
    if not outcome["ok"]:
        raise AssertionError(f"the benchmark's command was refused: {outcome['error']}")


def _setup() -> StateMachine:
    sm = StateMachine()
    for i, b in enumerate(BROKERS):
        _send(sm, i, {"type": "RegisterBroker", "broker": b, "address": f"http://{b}:7000"})
    _send(sm, len(BROKERS), {"type": "CreateTopic", "topic": TOPIC, "queues": QUEUES})
    return sm


def _config_lines(sm: StateMachine, n: int) -> list[str]:
    start = sm.image.version
    for i in range(n):   # values as vs_etcd's: f"{round tag}-{writer}-{n}"
        _send(sm, 100 + i, {"type": "SetTopicConfig", "topic": TOPIC, "config": {"k": f"c64r3-{i % 64}-{i // 64}"}})
    return sm.image.history_after(start, n)


def _made_lines(start: int, events: Iterator[dict]) -> list[str]:
    # What Image._record keeps for an event, versions continuing the setup's.
    return [canonical(stored(v, 2_000_000 + v, e)).decode() for v, e in enumerate(events, start + 1)]


def _budgets(n: int) -> Iterator[dict]:
    for i in range(n):
        q = i % QUEUES
        yield make("OffsetBudgetGranted", topic=TOPIC, queue=q, gen=0, broker=BROKERS[q % len(BROKERS)],
                   budget_end=1000 * (i + 2))


def _locks(n: int) -> Iterator[dict]:
    for i in range(n):
        q, token = i % QUEUES, i // 2 + 1
        if i % 2 == 0:
            yield make("LockGranted", group="billing", topic=TOPIC, queue=q, member=f"m{q}", token=token)
        else:
            yield make("LockReleased", group="billing", topic=TOPIC, queue=q, member=f"m{q}", token=token,
                       reason="released")


def _apply(store: SqlProjection, batch: list[str]) -> int:
    """What the writer process does with one batch of lines (meta/projection/writer_process.py ``serve``)."""
    return store.apply_lines(batch)


def _round(setup: list[str], lines: list[str], batch: int) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-projection-") as d:
        store = SqlProjection(f"sqlite:///{d}/projection.db")
        try:
            store.migrate()
            _apply(store, setup)
            started = time.process_time()
            for i in range(0, len(lines), batch):
                position = _apply(store, lines[i:i + batch])
            took = time.process_time() - started
        finally:
            store.close()
    if position != len(setup) + len(lines):
        raise AssertionError(f"the projection ended at version {position}, not {len(setup) + len(lines)}")
    return took / len(lines) * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=500, help="events per apply (the follower sends up to 2,000)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS))
    args = parser.parse_args(argv)
    kinds = args.kinds.split(",")
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"unknown kinds {sorted(unknown)}; choose from {list(KINDS)}")
    n, batch = max(1, args.events), max(1, args.batch)

    sm = _setup()
    setup = sm.image.history_after(0, sm.image.version)
    makers: dict[str, Callable[[], list[str]]] = {
        "config": lambda: _config_lines(_setup(), n),
        "budget": lambda: _made_lines(len(setup), _budgets(n)),
        "lock": lambda: _made_lines(len(setup), _locks(n)),
    }
    out = {"benchmark": "projection_writer", "backend": "sqlite file", "events": n, "batch": batch,
           "rounds": args.rounds, "loadavg_before": loadavg()}
    for kind in kinds:
        lines = makers[kind]()
        took = [_round(setup, lines, batch) for _ in range(max(1, args.rounds))]
        out[kind] = {"cpu_us_per_event_best": round(min(took), 1),
                     "cpu_us_per_event_median": round(statistics.median(took), 1),
                     "line_chars_mean": round(sum(map(len, lines)) / len(lines))}
        say(f"projection_writer: {kind} {out[kind]} (load {loadavg()})")
    out["loadavg_after"] = loadavg()
    emit(out)


if __name__ == "__main__":
    main()
