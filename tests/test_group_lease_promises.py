"""What a new meta leader counts a silent member's lease against after lease_ms was shortened (meta/groups.py
promise_after_shortening, lease_still_promised_ms; the image keeps the record, meta/group_sessions.py reads it on a
change of leader). tests/test_groups_meta.py runs the same on a real cluster that loses its leader."""

from __future__ import annotations

from meta import groups


def test_a_shortened_lease_is_remembered_as_long_as_an_answer_may_carry_the_longer_one():
    g = {"lease_promised": groups.promise_after_shortening(None, 6000, ts=10_000)}
    assert g["lease_promised"] == {"lease_ms": 6000, "until_ms": 16_000}
    assert groups.lease_still_promised_ms(g, 12_000) == 6000
    # kept one such lease past until_ms (an answer read the old setting until the change applied), then forgotten
    assert groups.lease_still_promised_ms(g, 21_999) == 6000
    assert groups.lease_still_promised_ms(g, 22_000) == 0
    assert groups.lease_still_promised_ms({}, 12_000) == 0


def test_shortening_again_keeps_the_longest_lease_still_running():
    first = groups.promise_after_shortening(None, 8000, ts=10_000)       # 8 s -> 4 s
    second = groups.promise_after_shortening(first, 4000, ts=12_000)     # 4 s -> 2 s, the 8 s ones still run
    assert second == {"lease_ms": 8000, "until_ms": 18_000}
    # once the earlier record has run out, a new shortening stands alone
    assert groups.promise_after_shortening(first, 4000, ts=30_000) == {"lease_ms": 4000, "until_ms": 34_000}
