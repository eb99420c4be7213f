"""`stator sim`: run seeds of the deterministic simulator on worker processes and print one JSON summary.

    stator sim --seeds 200 --workers 2                 # seeds 1..200, 10 virtual seconds each
    stator sim --seed 17                               # one seed, its full result
    stator sim --seed 17 --plan '<json faults>'        # replay a (shrunk) fault list
    stator sim --seeds 20 --check-determinism          # each seed twice, in other processes: same trace hash
    stator sim --seeds 50 --shrink                     # failing seeds shrunk to fewer faults
    stator sim --seeds 50 --l2                         # raft messages also duplicated and delayed (MessageTap)
    stator sim --seeds 50 --brokers                    # real brokers too, the chaos senders, read back and checked

The command re-executes itself under PYTHONHASHSEED=0 when that is not set (pysyncobj iterates sets hashed by
address strings). Exit 1 when any seed broke a safety check (or a replay differed); liveness findings (a setup that
never took, a cluster that did not converge after the heal) are reported and do not fail the run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import click

from .faults import BROKER_KINDS, KINDS, Fault

SEEDS_MAX = 1_000_000
WORKERS_MAX = 64
DURATION_S_MAX = 600.0
SHRINK_RUNS_MAX = 60
VIOLATIONS_SHOWN_MAX = 3
EXAMPLES_MAX = 10


def _reexec_with_fixed_hash_seed() -> None:
    if os.environ.get("PYTHONHASHSEED") == "0":
        return
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    os.execve(sys.executable, [sys.executable, "-c", "from ops.cli import main; main(prog_name='stator')",
                               *sys.argv[1:]], env)


def _replay(seed: int, duration_s: float, kinds: tuple[str, ...], faults: list[dict[str, Any]] | None,
            l2: bool, brokers: bool) -> str:
    line = f"PYTHONHASHSEED=0 stator sim --seed {seed} --duration {duration_s:g}" + (" --l2" if l2 else "")
    line += " --brokers" if brokers else ""
    if kinds != KINDS:
        line += f" --faults {','.join(kinds)}"
    if faults is not None:
        line += f" --plan '{json.dumps(faults, separators=(',', ':'))}'"
    return line


def _brief(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"check": v["check"], "message": v["message"]} for v in result["violations"][:VIOLATIONS_SHOWN_MAX]]


@click.command("sim")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=None, help="run this one seed (full result)")
@click.option("--first", type=click.IntRange(0, 2**63 - 1), default=1, show_default=True, help="first seed of a batch")
@click.option("--seeds", "count", type=click.IntRange(1, SEEDS_MAX), default=20, show_default=True)
@click.option("--workers", type=click.IntRange(1, WORKERS_MAX), default=2, show_default=True)
@click.option("--duration", "duration_s", type=click.FloatRange(2, DURATION_S_MAX), default=10.0, show_default=True,
              help="virtual seconds of faults and workload per schedule (then heal, 5 s quiet, checks)")
@click.option("--faults", "kinds_csv", default=",".join(KINDS), show_default=True, help="fault kinds to draw from")
@click.option("--plan", "plan_json", default=None, help="with --seed: this JSON fault list instead of the seed's")
@click.option("--check-determinism", is_flag=True, help="run every seed twice and compare the trace hashes")
@click.option("--shrink", "do_shrink", is_flag=True, help="shrink each failing seed's fault list (greedy)")
@click.option("--l2", is_flag=True, help="also duplicate and delay raft messages (beyond TCP: failures labelled l2)")
@click.option("--brokers", is_flag=True, help="also run real brokers and the chaos runner's senders (ops/sim/brokers.py)")
def sim(seed: int | None, first: int, count: int, workers: int, duration_s: float, kinds_csv: str,
        plan_json: str | None, check_determinism: bool, do_shrink: bool, l2: bool, brokers: bool) -> None:
    """The deterministic simulator of the meta cluster (three real meta nodes, virtual time, seeded faults)."""
    _reexec_with_fixed_hash_seed()
    from .run import WORKLOADS, run_schedule, run_seeds, shrink
    workloads = WORKLOADS + (("brokers",) if brokers else ())
    if brokers and kinds_csv == ",".join(KINDS):   # the default: the brokers' faults too
        kinds_csv += "," + ",".join(BROKER_KINDS)
    kinds = tuple(k for k in kinds_csv.split(",") if k)
    unknown = [k for k in kinds if k not in KINDS + BROKER_KINDS]
    if unknown or not kinds:
        raise click.BadParameter(f"unknown fault kinds {unknown}; known: {','.join(KINDS)}", param_hint="--faults")
    if plan_json is not None and seed is None:
        raise click.BadParameter("--plan replays one seed: give --seed too", param_hint="--plan")
    if seed is not None:
        faults = [Fault.from_json(f) for f in json.loads(plan_json)] if plan_json is not None else None
        result = run_schedule(seed, faults, duration_s, kinds, l2, workloads=workloads)
        out: dict[str, Any] = {**result}
        if check_determinism:
            again = run_schedule(seed, faults, duration_s, kinds, l2, workloads=workloads)
            out["deterministic"] = again["trace_hash"] == result["trace_hash"]
        if not result["ok"]:
            out["replay"] = _replay(seed, duration_s, kinds, result["faults"] if plan_json is not None else None, l2,
                                    brokers)
        click.echo(json.dumps(out, indent=1))
        sys.exit(0 if result["ok"] and out.get("deterministic", True) else 1)

    started = time.perf_counter()
    results = list(run_seeds(first, count, workers, duration_s, kinds, l2, workloads))
    wall_s = time.perf_counter() - started
    summary: dict[str, Any] = {
        "first": first, "seeds": count, "workers": workers, "duration_s": duration_s, "faults": list(kinds), "l2": l2,
        "wall_s": round(wall_s, 2), "schedules_per_minute": round(count / wall_s * 60, 1),
        "failed": [], "liveness": [], "ops_ok": sum(r["counts"].get("ops_ok", 0) for r in results),
        "terms_max": max((r["counts"].get("terms", 0) for r in results), default=0),
        "boots": sum(r["counts"].get("boots", 0) for r in results),
        "unsynced_bytes_lost": sum(r["counts"].get("unsynced_bytes_lost", 0) for r in results),
    }
    for r in results:
        if not r["ok"]:
            failed: dict[str, Any] = {"seed": r["seed"], "violations": _brief(r),
                                      "replay": _replay(r["seed"], duration_s, kinds, None, l2, brokers)}
            if do_shrink and r["faults"]:
                smaller, runs = shrink(r["seed"], [Fault.from_json(f) for f in r["faults"]], duration_s,
                                       SHRINK_RUNS_MAX, l2, workloads)
                failed["shrunk"] = {"faults": len(r["faults"]), "to": len(smaller), "runs": runs,
                                    "replay": _replay(r["seed"], duration_s, kinds, [f.to_json() for f in smaller],
                                                      l2, brokers)}
            summary["failed"].append(failed)
        if r["liveness"] and len(summary["liveness"]) < EXAMPLES_MAX:
            summary["liveness"].append({"seed": r["seed"], "checks": [v["check"] for v in r["liveness"]]})
    summary["liveness_seeds"] = sum(bool(r["liveness"]) for r in results)
    ok = not summary["failed"]
    if check_determinism:
        again = {r["seed"]: r["trace_hash"] for r in run_seeds(first, count, workers, duration_s, kinds, l2,
                                                                  workloads)}
        differ = [r["seed"] for r in results if again.get(r["seed"]) != r["trace_hash"]]
        summary["nondeterministic_seeds"] = differ
        ok = ok and not differ
    click.echo(json.dumps(summary, indent=1))
    sys.exit(0 if ok else 1)
