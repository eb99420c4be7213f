"""Replay a schedule's committed log into a fresh state machine and print the image's digest: run under two
PYTHONHASHSEEDs, the digests must match (one simulator process has one hash seed, so it cannot see an apply whose
output depends on the iteration order of a set of strings).

    python -m ops.sim.apply_hash < log.jsonl      # one JSON line per entry: {"kind": "entry"|"membership", "hex": ...}
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any

from meta.backup import image_digest
from meta.image import Image
from meta.raft.entry import decode_entry
from meta.state_machine import StateMachine


def log_lines(applies: Iterable[tuple[int, bytes | None]]) -> str:
    """A node's applied entries (its apply tap, ops/sim/node.py) as the JSON lines this module reads."""
    from meta.raft.pysyncobj_shim import MembershipPayload
    out = []
    for _index, payload in applies:
        if payload is not None:
            kind = "membership" if isinstance(payload, MembershipPayload) else "entry"
            out.append(json.dumps({"kind": kind, "hex": bytes(payload).hex()}))
    return "\n".join(out) + "\n"


def digest(lines: Iterable[str]) -> str:
    machine = StateMachine(Image())
    for line in lines:
        if not line.strip():
            continue
        doc: dict[str, Any] = json.loads(line)
        envelopes = decode_entry(bytes.fromhex(doc["hex"]))
        if doc["kind"] == "membership":
            machine.apply_membership(envelopes[0] if len(envelopes) == 1 else None)
            continue
        for envelope in envelopes:
            machine.apply(envelope)
    return image_digest(machine.image.data)


if __name__ == "__main__":
    print(digest(sys.stdin))
