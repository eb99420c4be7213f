"""Who the members are: the cluster's membership, kept in the log itself.

A membership entry is an entry of its own (pysyncobj's MEMBERSHIP type byte, never batched with other proposals)
holding one envelope whose command is ``SetMembership``: the whole member list, each a node name, its raft address
(as the node that wrote the entry reaches it), its HTTP URL, the id of its disk (``wire/disk_identity.py``; none for
a learner not heard from yet) and whether it votes. Raft takes a configuration from the newest membership entry in a
node's log, committed or not, so the journal tracks them as they are appended, truncated and compacted
(``MembershipTrail``); a snapshot carries the membership of its index in the image (``image["members"]``).

This module is the format and the trail; what a node does with them (voter or learner, bootstrap, promotions,
operators' changes) is ``meta/raft/roles.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import limits
from wire.disk_identity import is_disk_id
from .entry import decode_entry, encode_entry, encode_envelope

MEMBERSHIP_COMMAND = 2          # pysyncobj's _COMMAND_TYPE.MEMBERSHIP (test_pysyncobj_pin holds the value)
COMMAND_TYPE = "SetMembership"
MEMBERS_MAX = 9
NAME_CHARS_MAX = limits.BROKER_NAME_CHARS_MAX   # a node's name: the config's rule (runtime/config_file.py)
RAFT_ADDRESS_CHARS_MAX = 262    # a DNS name, a colon and a port
URL_CHARS_MAX = 2048
REASONS = frozenset({"bootstrap", "rejoin", "add", "promote", "remove"})


@dataclass(frozen=True, order=True)
class Member:
    raft: str            # as the node that wrote the entry reached it
    name: str
    disk: str | None     # None: a learner added by an operator that has not been heard from yet
    url: str | None      # its HTTP API (None in a bootstrap written by a node whose config did not say)
    voter: bool

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "raft": self.raft, "disk": self.disk, "url": self.url, "voter": self.voter}


Members = tuple[Member, ...]
_KEYS = {"name", "raft", "disk", "url", "voter"}


def command(members: Members, reason: str) -> dict[str, Any]:
    return {"type": COMMAND_TYPE, "reason": reason, "members": [m.to_json() for m in sorted(members)]}


def valid_name(name: Any) -> bool:
    # Length only: a node without a configured name (tests' in-process nodes) goes by its raft address. The HTTP API
    # holds an operator's names to the config's pattern too (meta/api/members.py).
    return isinstance(name, str) and 0 < len(name) <= NAME_CHARS_MAX


def valid_raft(raft: Any) -> bool:
    return isinstance(raft, str) and 0 < len(raft) <= RAFT_ADDRESS_CHARS_MAX and ":" in raft


def valid_url(url: Any) -> bool:
    return isinstance(url, str) and 0 < len(url) <= URL_CHARS_MAX and url.startswith(("http://", "https://"))


def parse(cmd: Any) -> Members | None:
    """The members a ``SetMembership`` command names, or None if it is not a well-formed one: at least one voter,
    names and raft addresses unique, every voter with a disk id."""
    if not isinstance(cmd, dict) or cmd.get("type") != COMMAND_TYPE or cmd.get("reason") not in REASONS:
        return None
    raw = cmd.get("members")
    if not isinstance(raw, list) or not 1 <= len(raw) <= MEMBERS_MAX:
        return None
    members = []
    for m in raw:
        if not isinstance(m, dict) or set(m) != _KEYS:
            return None
        name, raft, disk, url, voter = m["name"], m["raft"], m["disk"], m["url"], m["voter"]
        if not (valid_name(name) and valid_raft(raft) and isinstance(voter, bool)
                and (disk is None and not voter or is_disk_id(disk)) and (url is None or valid_url(url))):
            return None
        members.append(Member(raft=raft, name=name, disk=disk, url=url, voter=voter))
    if len({m.raft for m in members}) != len(members) or len({m.name for m in members}) != len(members):
        return None
    if not any(m.voter for m in members):
        return None
    return tuple(sorted(members))


def payload(members: Members, reason: str, stamp: bytes) -> bytes:
    """The payload of a MEMBERSHIP entry (its type byte is pysyncobj's): what ``parse_entry`` reads back."""
    envelope = encode_envelope({"rid": None, "actor": "system", "cmd": command(members, reason)})
    return encode_entry(stamp, [envelope])


def parse_entry(command_bytes: bytes) -> Members | None:
    """The voters of a journal entry of the MEMBERSHIP type (type byte included), or None if malformed."""
    envelopes = decode_entry(command_bytes[1:])
    if len(envelopes) != 1 or not isinstance(envelopes[0], dict):
        return None
    return parse(envelopes[0].get("cmd"))


def from_image(image_members: Any) -> Members | None:
    """The membership an image holds (``image["members"]``, the list ``command`` writes), None when it has none."""
    if not image_members:
        return None
    return parse({"type": COMMAND_TYPE, "reason": "bootstrap", "members": image_members})


def is_voter(members: Members, name: str, disk: str) -> bool:
    # By name: nodes may reach one another at different addresses (a proxy, NAT, a DNS alias), a name is one.
    return any(m.name == name and m.disk == disk and m.voter for m in members)


def by_name(members: Members, name: str) -> Member | None:
    return next((m for m in members if m.name == name), None)


def replaced(members: Members, member: Member) -> Members:
    """``members`` with ``member`` in place of the one of its name (or added)."""
    return tuple(sorted([m for m in members if m.name != member.name] + [member]))


_UNKNOWN = object()


class MembershipTrail:
    """The membership entries of one node's log, newest last, fed by the journal as it changes.

    ``current()`` is the newest: of the entries still in the log, or the snapshot's (``base``) when the log holds
    none after it. Not thread-safe: the tick feeds and reads it (the journal is only touched there)."""

    def __init__(self) -> None:
        self._entries: list[tuple[int, Members | None]] = []
        self._base: tuple[int, Members] | None = None
        # current()'s answer until the trail changes: the tick asks for it twice a tick (Roles), ~1% of a node's CPU
        self._current: tuple[int, Members] | None | object = _UNKNOWN
        self.changes = 0   # counts the changes of what current() and before() answer (Roles reads them off once)

    def appended(self, index: int, command_bytes: bytes) -> None:
        # A malformed one is kept as None: it is not a membership (apply rejects it the same way on every node).
        members = parse_entry(command_bytes)
        self._entries.append((index, members))
        if members is not None:
            self._changed()

    def truncated_from(self, index: int) -> None:
        """Entries at ``index`` and after left the log (a conflict with the leader's)."""
        kept = [(i, m) for i, m in self._entries if i < index]
        self._entries = kept
        self._changed()

    def compacted_before(self, index: int) -> None:
        """Entries before ``index`` left the log (compaction): the newest of them stays, it is still in force."""
        older = [e for e in self._entries if e[0] < index and e[1] is not None]
        newer = [e for e in self._entries if e[0] >= index]
        self._entries = older[-1:] + newer
        self._changed()

    def cleared(self) -> None:
        """Every entry left the log (a snapshot installed from the leader: ``set_base`` says what it held)."""
        self._entries = []
        self._changed()

    def set_base(self, index: int, members: Members | None) -> None:
        self._base = (index, members) if members else None
        self._changed()

    def _changed(self) -> None:
        self._current = _UNKNOWN
        self.changes += 1

    def before(self, index: int) -> Members | None:
        """The membership in force before the entry at ``index`` (the one it replaces), or None when unknown."""
        older = next((m for i, m in reversed(self._entries) if i < index and m is not None), None)
        if older is not None:
            return older
        base = self._base
        return base[1] if base is not None and base[0] < index else None

    def current(self) -> tuple[int, Members] | None:
        """(log index, voters) of the membership in force on this node, or None before the first one."""
        if self._current is _UNKNOWN:
            self._current = self._newest()
        return self._current   # type: ignore[return-value]

    def _newest(self) -> tuple[int, Members] | None:
        newest = next(((i, m) for i, m in reversed(self._entries) if m is not None), None)
        base = self._base
        if newest is None or (base is not None and base[0] >= newest[0]):
            return base
        return newest
