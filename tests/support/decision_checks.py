"""Small checks over ``Log`` (tests/support/state_machine_builders.py) for tests that compare a decision's whole
output: the events a command emitted, as ``{"type", **fields}`` (a refusal's whole error: ``Log.reject``)."""

from __future__ import annotations

from typing import Any

from tests.support.state_machine_builders import Log


def emitted(log: Log, since: int, *types: str) -> list[dict[str, Any]]:
    """The events stored after version ``since`` (of ``types`` only, when named), each as its type and fields."""
    return [{"type": e["type"], **e["data"]} for e in log.events(since) if not types or e["type"] in types]


def brokers(*names: str, **clusters: str) -> Log:
    """A log with ``names`` registered, each in the cluster ``clusters`` names for it (the default one otherwise)."""
    log = Log()
    for n in names:
        log.register(n, cluster=clusters.get(n))
    return log
