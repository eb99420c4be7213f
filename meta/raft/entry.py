"""The bytes of one log entry: a batch of proposals under one stamp of the leader.

An entry's payload (after pysyncobj's type byte) is lines of compact JSON, which never holds a raw newline:

    {"ts":...,"budget":...,"history":...}      the leader's stamp: its clock, offset budget and history window
    {"rid":...,"actor":...,"cmd":{...}}        one envelope per proposal, in the order they are applied
    ...

Every proposal of a batch gets the same stamp and is decided on its own: one rejection does not touch its
neighbours. The leader stamps a follower's batch by replacing the first line, without decoding and re-encoding
envelopes of up to 8 MiB in its tick. A single proposal is a batch of one. This module is the one writer and
the one parser of the format; apply (meta/raft/node.py), the offline tools (meta/offline_log.py) and tests use it.
"""

from __future__ import annotations

import json
from typing import Any

from wire import json_body

from .. import limits

STAMP_FIELDS = frozenset({"ts", "budget", "history"})
ENVELOPE_OVERHEAD_BYTES_MAX = 4096   # rid, ts, budget and actor around the command
ENVELOPE_BYTES_MAX = limits.COMMAND_BYTES_MAX + ENVELOPE_OVERHEAD_BYTES_MAX
# One entry: pysyncobj's type byte, the stamp line, and envelopes. A batch never grows past the largest single
# proposal, so the largest entry is what it was before batching (pysyncobj_shim: append messages must carry it whole).
ENTRY_BYTES_MAX = 1 + ENVELOPE_BYTES_MAX
STAMP_BYTES_MAX = 256                # three integers and their names
PROPOSALS_PER_ENTRY_MAX = 1024       # bounds the work of one entry's apply, whatever the sizes

# Entries are written ASCII (ensure_ascii), once, by the node that proposes; every replica reads them with orjson.
# ASCII keeps an entry's size what API limits were drawn for: an astral character costs 12 bytes, so the largest
# HTTP body still makes a ~1 MiB entry (ops/chaos sizes workload, tests/test_raft_entry_sizes.py).
compact = json.JSONEncoder(separators=(",", ":")).encode


def _compact_bytes(value: Any) -> bytes:
    """``compact(value)``'s bytes. json_body's orjson encoder writes the same compact JSON several times faster (the
    stdlib encoder was ~3% of a node's CPU at 64 writers); its text is taken when it is ASCII and holds no null.
    Anything else goes to the stdlib encoder, as before: text that is not ASCII (to be escaped), a lone surrogate or
    an integer past 64 bits (orjson refuses them), a non-finite float (orjson writes null where the stdlib writes
    NaN, which apply refuses; a null may be one). A float may be spelled otherwise (1e16 for 1e+16): both read back
    the same value, and an entry is written once, by its proposer."""
    try:
        text = json_body.encode(value)
    except TypeError:
        return compact(value).encode()
    if text.isascii() and b"null" not in text:
        return text
    return compact(value).encode()


def encode_stamp(stamp: dict[str, Any]) -> bytes:
    return _compact_bytes(stamp)


def encode_envelope(envelope: dict[str, Any]) -> bytes:
    return _compact_bytes(envelope)


def encode_entry(stamp: bytes, envelopes: list[bytes]) -> bytes:
    """The payload of one entry: the stamp line, then each envelope's line."""
    return b"\n".join([stamp, *envelopes])


def restamped(payload: bytes, stamp: bytes) -> bytes | None:
    """``payload`` under another stamp; None if it has no stamp line (apply rejects it as it is)."""
    _head, separator, envelopes = payload.partition(b"\n")
    return stamp + separator + envelopes if separator else None


def decode_entry(payload: Any) -> list[Any]:
    """The envelopes of an entry, each with the leader's stamp merged in, in order. What cannot be decoded becomes
    None in its place, which apply rejects like any bad envelope: a bad stamp spoils every envelope of its entry,
    a bad envelope only itself. Never empty: an entry with no envelope line is one bad envelope."""
    if isinstance(payload, str):
        payload = payload.encode("utf-8", "surrogatepass")
    if not isinstance(payload, bytes) or len(payload) > ENTRY_BYTES_MAX:
        return [None]
    lines = payload.split(b"\n")
    if len(lines) < 2:
        return [None]
    try:
        stamp = json_body.decode(lines[0])
    except (ValueError, RecursionError):
        stamp = None
    if not isinstance(stamp, dict) or not stamp.keys() <= STAMP_FIELDS:
        return [None] * (len(lines) - 1)
    return [_envelope(line, stamp) for line in lines[1:]]


def _envelope(line: bytes, stamp: dict[str, Any]) -> Any:
    if len(line) > ENVELOPE_BYTES_MAX:
        return None
    try:
        envelope = json_body.decode(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(envelope, dict):
        return None
    envelope.update(stamp)
    return envelope
