"""Small checks over ``Log`` (tests/support/state_machine_builders.py) for tests that compare a decision's whole
output: the events a command emitted, as ``{"type", **fields}``, and a refusal's whole error."""

from __future__ import annotations

from typing import Any

from tests.support.state_machine_builders import CATCH_ALL, Log, stable


def emitted(log: Log, since: int, *types: str) -> list[dict[str, Any]]:
    """The events stored after version ``since`` (of ``types`` only, when named), each as its type and fields."""
    return [{"type": e["type"], **e["data"]} for e in log.events(since) if not types or e["type"] in types]


def refusal(log: Log, cmd: dict[str, Any]) -> dict[str, Any]:
    """The whole error of a command that must be refused by a decision (not by its catch-all), the image unchanged."""
    before, version = stable(log.sm), log.version
    out = log.send(cmd)
    assert out["ok"] is False, out
    assert not out["error"]["message"].startswith(CATCH_ALL), out["error"]
    assert log.version == version and stable(log.sm) == before, "a refusal changed the image"
    return out["error"]


def brokers(*names: str, **clusters: str) -> Log:
    """A log with ``names`` registered, each in the cluster ``clusters`` names for it (the default one otherwise)."""
    log = Log()
    for n in names:
        log.register(n, cluster=clusters.get(n))
    return log
