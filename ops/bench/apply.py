"""The state machine alone: how long one committed entry takes on the apply thread, which every replica runs.

    python -m ops.bench.apply [--commands 20000] [--rounds 3] [--queues 1000]

No cluster, no threads: log entries encoded as the proposing node encodes them (meta/raft/entry.py), decoded and
applied as ``MetaSyncObj._apply_entry`` does, one proposal per entry, each with an idempotency key (so the outcome
is remembered, as for every HTTP write). Four kinds: ``set_config`` (one key, a distinct value each time: the
write of ``ops.bench.vs_etcd``), ``set_config_retry`` (the same keys again: answered from the remembered outcome),
``set_config_at_cap`` (set_config with REQUEST_OUTCOMES_MAX outcomes remembered already, as a busy node's image
holds: each apply evicts the oldest) and ``create`` (topics of ``--queues`` queues). Prints one JSON object:
microseconds per command, the best and the median of ``--rounds`` (the machine may be shared; the best is the
code's cost, the median the machine's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from meta import limits
from meta.raft.entry import decode_entry, encode_entry, encode_envelope, encode_stamp
from meta.state_machine import StateMachine

from .common import loadavg

BUDGET = 1000
BROKERS = ("b1", "b2", "b3")
CREATES_MAX = 200       # topics of --queues queues per round: enough for a stable figure, bounded memory


def _entry(i: int, cmd: dict[str, Any], rid: str) -> bytes:
    envelope = encode_envelope({"rid": rid, "actor": "admin", "cmd": cmd})
    return encode_entry(encode_stamp({"ts": 2_000_000 + i, "budget": BUDGET}), [envelope])


def _apply_all(sm: StateMachine, entries: list[bytes]) -> None:
    for payload in entries:
        for envelope in decode_entry(payload):
            outcome, _changed = sm.apply(envelope)
            if not outcome["ok"]:
                raise AssertionError(f"the benchmark's command was refused: {outcome['error']}")


def _machine() -> StateMachine:
    sm = StateMachine()
    _apply_all(sm, [_entry(i, {"type": "RegisterBroker", "broker": b, "address": f"http://{b}:7000"}, f"reg-{b}")
                    for i, b in enumerate(BROKERS)])
    _apply_all(sm, [_entry(10, {"type": "CreateTopic", "topic": "p", "queues": 4}, "create-p")])
    return sm


def _timed(prepare: Callable[[], tuple[StateMachine, list[bytes]]]) -> float:
    sm, entries = prepare()
    started = time.perf_counter()
    _apply_all(sm, entries)
    return (time.perf_counter() - started) / len(entries) * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queues", type=int, default=1000)
    args = parser.parse_args(argv)
    n = max(1, args.commands)
    creates = max(1, min(n, CREATES_MAX))

    def configs(rid: str) -> list[bytes]:
        return [_entry(100 + i, {"type": "SetTopicConfig", "topic": "p", "config": {"k": f"v{i}"}}, f"{rid}-{i:08d}")
                for i in range(n)]

    def set_config():
        return _machine(), configs("w")

    def set_config_at_cap():
        sm = _machine()
        requests = sm.image.data["requests"]
        seen = next(iter(requests.values()))   # a remembered outcome (a tuple of atoms: shared, never changed)
        for i in range(limits.REQUEST_OUTCOMES_MAX - len(requests)):
            requests[f"earlier-{i:08d}"] = seen
        return sm, configs("w")

    def set_config_retry():
        sm = _machine()
        entries = configs("w")
        _apply_all(sm, entries)
        return sm, entries

    def create():
        return _machine(), [_entry(100 + i, {"type": "CreateTopic", "topic": f"t{i}", "queues": args.queues},
                                   f"c-{i}") for i in range(creates)]

    kinds = {"set_config": set_config, "set_config_retry": set_config_retry, "set_config_at_cap": set_config_at_cap,
             "create": create}
    out: dict[str, Any] = {"benchmark": "apply", "commands": n, "creates": creates, "create_queues": args.queues,
                           "rounds": args.rounds, "loadavg_before": loadavg()}
    for name, prepare in kinds.items():
        took = [_timed(prepare) for _ in range(max(1, args.rounds))]
        out[name] = {"us_per_command_best": round(min(took), 1), "us_per_command_median": round(statistics.median(took), 1)}
        print(f"apply: {name} {out[name]}", file=sys.stderr)
    out["loadavg_after"] = loadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
