"""The membership's parts without a cluster: the disk identity file, the journal's trail of membership entries, and
the state machine's membership apply (wire/disk_identity.py, meta/raft/membership.py). The cluster behaviour is in
tests/test_meta_disk_loss.py and the chaos runner's ``wipe`` fault."""

from __future__ import annotations

import json
import os

import pytest

from wire import disk_identity
from meta.raft import membership as raft_membership
from meta.image import Image
from meta.raft.entry import encode_stamp
from meta.raft.journal import StatorJournal
from meta.raft.membership import MEMBERSHIP_COMMAND, Member, MembershipTrail
from meta.state_machine import StateMachine

DISKS = ["a" * 32, "b" * 32, "c" * 32]


def _members(*disks: str) -> tuple[Member, ...]:
    return tuple(Member(raft=f"127.0.0.1:{7000 + i}", name=f"m{i + 1}", disk=d, url=f"http://127.0.0.1:{7100 + i}",
                        voter=True) for i, d in enumerate(disks))


def _entry(members: tuple[Member, ...], reason: str = "bootstrap") -> bytes:
    return bytes([MEMBERSHIP_COMMAND]) + raft_membership.payload(members, reason, encode_stamp({"ts": 1}))


# -- disk identity -------------------------------------------------------------------------------------------------
def test_a_disk_id_is_made_once_and_kept(tmp_path):
    disk, created = disk_identity.load_or_create(str(tmp_path / "d"))
    assert created and disk_identity.is_disk_id(disk)
    assert disk_identity.load_or_create(str(tmp_path / "d")) == (disk, False)
    other, created = disk_identity.load_or_create(str(tmp_path / "e"))
    assert created and other != disk


@pytest.mark.parametrize("content, named", [
    (b"not json", "not a Stator disk identity file"),
    (json.dumps({"format": "something-else", "version": 1, "disk": "a" * 32}).encode(), "not a Stator disk identity"),
    (json.dumps({"format": "stator-disk-identity", "version": 2, "disk": "a" * 32}).encode(), "version 2"),
    (json.dumps({"format": "stator-disk-identity", "version": 1, "disk": "XYZ"}).encode(), "lowercase hex"),
])
def test_an_identity_file_this_version_does_not_read_is_refused_by_name(tmp_path, content, named):
    os.makedirs(tmp_path / "d")
    (tmp_path / "d" / disk_identity.IDENTITY_FILE).write_bytes(content)
    with pytest.raises(disk_identity.DiskIdentityError, match=named):
        disk_identity.load_or_create(str(tmp_path / "d"))
    assert (tmp_path / "d" / disk_identity.IDENTITY_FILE).read_bytes() == content   # never replaced


# -- parse -----------------------------------------------------------------------------------------------------------
def test_parse_takes_only_a_whole_well_formed_membership():
    members = _members(*DISKS)
    assert raft_membership.parse(raft_membership.command(members, "rejoin")) == members
    good = raft_membership.command(members, "bootstrap")
    bad = [
        {**good, "type": "Barrier"}, {**good, "reason": "because"}, {**good, "members": []},
        {**good, "members": good["members"] * 4},                                       # past MEMBERS_MAX
        {**good, "members": [good["members"][0], good["members"][0]]},                  # a name twice
        {**good, "members": [{**good["members"][0], "disk": "short"}]},
        {**good, "members": [{**good["members"][0], "extra": 1}]},
        {**good, "members": [{**good["members"][0], "raft": "no-port"}]},
        {**good, "members": [{**good["members"][0], "name": ""}]}, None, [], "x",
        {**good, "members": [{**good["members"][0], "name": "n" * 65}]},                  # past the config's rule
        {**good, "members": [{**good["members"][0], "voter": "yes"}]},
        {**good, "members": [{**good["members"][0], "url": "ftp://x"}]},
        {**good, "members": [{**m, "voter": False} for m in good["members"]]},              # no voter at all
        {**good, "members": [{**good["members"][0], "disk": None}]},                        # a voter without a disk
    ]
    assert [raft_membership.parse(cmd) for cmd in bad] == [None] * len(bad)
    assert raft_membership.parse_entry(_entry(members)) == members
    assert raft_membership.parse_entry(bytes([MEMBERSHIP_COMMAND]) + b"garbage") is None


def test_a_voter_is_its_name_with_its_own_disk():
    members = _members(*DISKS)
    assert raft_membership.is_voter(members, "m2", DISKS[1])
    assert not raft_membership.is_voter(members, "m2", "d" * 32)    # a wiped m2
    assert not raft_membership.is_voter(members, "m4", DISKS[1])
    learner = raft_membership.replaced(members, Member(raft="127.0.0.1:7009", name="m4", disk=None, url=None,
                                                       voter=False))
    assert raft_membership.parse(raft_membership.command(learner, "add")) == learner
    assert not raft_membership.is_voter(learner, "m4", DISKS[1])


# -- the trail -------------------------------------------------------------------------------------------------------
def test_the_trail_follows_appends_truncations_compactions_and_a_snapshot():
    first, second = _members(*DISKS), _members(DISKS[0], "d" * 32, DISKS[2])
    trail = MembershipTrail()
    assert trail.current() is None
    trail.appended(3, _entry(first))
    trail.appended(9, _entry(second, "rejoin"))
    assert trail.current() == (9, second)
    trail.truncated_from(9)                      # a conflict took the rejoin back
    assert trail.current() == (3, first)
    trail.appended(9, bytes([MEMBERSHIP_COMMAND]) + b"not a membership")
    assert trail.current() == (3, first)         # a malformed one is not in force (apply rejects it too)
    trail.compacted_before(50)                   # the newest before the cut stays in force
    assert trail.current() == (3, first)
    trail.cleared()
    trail.set_base(60, second)                   # a snapshot installed from the leader
    assert trail.current() == (60, second)
    trail.appended(70, _entry(first, "rejoin"))
    assert trail.current() == (70, first)
    trail.set_base(80, second)                   # a newer snapshot wins over older entries
    assert trail.current() == (80, second)


def test_the_journal_finds_its_membership_entries_again_at_start(tmp_path):
    members = _members(*DISKS)
    journal = StatorJournal(str(tmp_path))
    journal.add(bytes([1]), 1, 0)
    journal.add(_entry(members), 2, 1)
    journal.add(bytes([0]) + b'{"ts":1}\n{}', 3, 1)
    assert journal.membership.current() == (2, members)
    journal._destroy()
    again = StatorJournal(str(tmp_path))
    assert again.membership.current() == (2, members)
    again.deleteEntriesFrom(1)                   # list position 1: index 2 and after
    assert again.membership.current() is None
    again._destroy()


# -- apply -----------------------------------------------------------------------------------------------------------
def test_apply_records_the_voters_and_a_regular_command_cannot():
    sm = StateMachine(Image())
    members = _members(*DISKS)
    before = sm.image.canonical_bytes()
    outcome = sm.apply_membership({"cmd": raft_membership.command(members, "bootstrap"), "ts": 1})
    assert outcome["ok"] and sm.image.data["members"] == [m.to_json() for m in members]
    # not part of the metadata's digest: a restored cluster has other disks (meta/backup.py)
    assert sm.image.canonical_bytes() == before
    refused = sm.apply_membership({"cmd": {"type": "SetMembership", "reason": "rejoin", "members": "x"}})
    assert not refused["ok"] and refused["error"]["status"] == 400
    assert sm.image.data["members"] == [m.to_json() for m in members]
    # Through a regular entry (what a client's command becomes) it is an unknown command: only the leader's
    # membership entries, which the journal tracks, may change the voters.
    outcome, _ = sm.apply({"rid": None, "ts": 2, "budget": 10, "actor": "admin",
                           "cmd": raft_membership.command(_members("d" * 32, *DISKS[1:]), "rejoin")})
    assert not outcome["ok"] and sm.image.data["members"] == [m.to_json() for m in members]


def test_a_membership_entry_a_log_conflict_drops_leaves_the_journal_s_membership(tmp_path):
    """Entries at index 5, 6 and 7 in term 1; the membership at index 7 is dropped by a conflict from index 6 on
    (pysyncobj's list position 1): the one at 5 is in force again."""
    j = StatorJournal(str(tmp_path))
    first, second = _members(DISKS[0]), _members(DISKS[0], DISKS[1])
    j.add(_entry(first), 5, 1)
    j.add(b"\x01plain", 6, 1)
    j.add(_entry(second, "add"), 7, 1)
    assert j.membership.current() == (7, second)
    j.deleteEntriesFrom(1)
    assert [e[1] for e in j[:]] == [5] and j.membership.current() == (5, first)
