"""`stator chaos run` / `stator chaos replay` (registered on the main CLI by ops/cli.py)."""

from __future__ import annotations

import json
import sys

import click

from .nemesis import KINDS

EXIT_VIOLATION = 1      # a check failed: the summary's violations say which and show the evidence
EXIT_NO_VERDICT = 3     # the runner could not do its work (a member did not start, a fault could not be healed)
DURATION_S_MAX = 24 * 3600


class FaultKinds(click.ParamType):
    name = "kinds"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        kinds = tuple(k.strip() for k in value.split(",") if k.strip())
        unknown = [k for k in kinds if k not in KINDS]
        if unknown or not kinds:
            self.fail(f"{value!r}: give a comma-separated list of {', '.join(KINDS)}", param, ctx)
        return kinds


def run_options(f):
    f = click.option("--seed", required=True, type=click.IntRange(0, 2**63 - 1), help="the nemesis's seed")(f)
    f = click.option("--duration", "duration_s", default=60.0, show_default=True,
                     type=click.FloatRange(5, DURATION_S_MAX), help="seconds of faults and workloads")(f)
    f = click.option("--faults", "kinds", default=",".join(KINDS), show_default=True, type=FaultKinds(),
                     help="fault kinds to inject")(f)
    f = click.option("--work-dir", "work_dir", type=click.Path(file_okay=False),
                     help="the cluster's directory (kept); default a temporary one, kept only when something failed")(f)
    f = click.option("--json", "as_json", is_flag=True, help="print the summary as one JSON object")(f)
    return f


@click.group()
def chaos() -> None:
    """Fault injection: a real cluster behind cuttable proxies, a seeded nemesis, checked client histories."""


@chaos.command("run")
@run_options
def chaos_run(seed: int, duration_s: float, kinds: tuple[str, ...], work_dir: str | None, as_json: bool) -> None:
    """Run workloads under faults for DURATION seconds, then check the history; exit 1 on any violation."""
    _run(seed, duration_s, kinds, work_dir, as_json, show_schedule=False)


@chaos.command("replay")
@run_options
def chaos_replay(seed: int, duration_s: float, kinds: tuple[str, ...], work_dir: str | None, as_json: bool) -> None:
    """Run the schedule of a seed again (the same seed, duration and faults give the same schedule); print it first."""
    _run(seed, duration_s, kinds, work_dir, as_json, show_schedule=True)


def _run(seed: int, duration_s: float, kinds: tuple[str, ...], work_dir: str | None, as_json: bool,
         show_schedule: bool) -> None:
    from ops import devcluster

    from . import nemesis, runner, topology
    # With --json, stdout carries exactly the summary object: the progress lines go to stderr.
    say = (lambda line: click.echo(line, err=True)) if as_json else click.echo
    say(f"seed: {seed}")
    if show_schedule:
        names = ([f"m{i + 1}" for i in range(topology.METAS)], [f"b{i + 1}" for i in range(topology.BROKERS)])
        for fault in nemesis.schedule(seed, duration_s, kinds, names):
            say(f"  {fault.describe()}")
    try:
        summary = runner.run(seed, duration_s, kinds, work_dir, say)
    except (runner.RunFailed, devcluster.MemberFailed, TimeoutError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_NO_VERDICT)
    replay = f"stator chaos replay --seed {seed} --duration {duration_s:g} --faults {','.join(kinds)}"
    if as_json:
        click.echo(json.dumps({**summary, "replay": replay}))
    else:
        _print_summary(summary, replay)
    if summary["violations"]:
        sys.exit(EXIT_VIOLATION)
    if summary["nemesis_errors"]:
        sys.exit(EXIT_NO_VERDICT)


def _print_summary(s: dict, replay: str) -> None:
    for v in s["violations"]:
        click.echo(f"VIOLATION {v['check']}: {v['message']}")
        click.echo(f"  evidence: {json.dumps(v['evidence'])[:2000]}")
    for e in s["nemesis_errors"]:
        click.echo(f"NEMESIS ERROR: {e}")
    b = s.get("broker_faults") or {}
    if b.get("faults"):
        click.echo(f"broker faults: {b['faults']} ({b['hit_a_leader']} hit a broker leading {b['heads_led_when_hit']} "
                   f"data heads); {b['sends_acked_during']} sends acknowledged during them, "
                   f"{b['sends_acked_by_the_broker_hit']} by the broker hit; "
                   f"{s['checks'].get('epochs_acked', 0)} leader epochs with acknowledged sends checked")
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(s["fault_kinds_injected"].items()))
    click.echo(f"seed {s['seed']}: {s['faults_injected']} faults injected ({kinds}), "
               f"{s['operations_checked']} operations checked, {s['snapshot_installs_seen']} snapshot installs seen "
               f"({s['install_faults_followed_by_install']['followed']} of "
               f"{s['install_faults_followed_by_install']['install_faults']} install faults followed by one), "
               f"{len(s['violations'])} violations, "
               f"{s['wall_s']} s" + (f"; evidence kept in {s['dir']}" if s["dir"] else "")
               + (f"; replay: {replay}" if s["violations"] else ""))
