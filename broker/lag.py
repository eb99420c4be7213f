"""A group's lag on a logic queue: the messages stored after its committed offset, segment by segment.

Logic offsets run on without a gap across a remap, with one exception: a segment whose broker's session lapsed is
sealed at the end of the offset budget the log granted it (DESIGN.md invariant 5), not at its last message, and the
next segment starts there. The offsets between hold no message. Lag as ``max_offset - committed`` counted them: a
group at offset 32 showed a lag of 999,968 after the guide's broker-death steps (issue 35).

So a segment counts what it stores: an open one up to its written end, one sealed by its broker's report up to that
end (exact), and one sealed at its budget's end up to what a holder of it still has (``stored_end``).
"""

from __future__ import annotations

from collections.abc import Iterable

from wire.route import Segment


def ends_at_budget(seg: Segment) -> bool:
    """Sealed at the end of its offset budget: its records may stop anywhere short of that end. A broker's report
    never reaches the budget's end (its budget is renewed half-way), so an exact end is never taken for one."""
    return seg.logic_end is not None and seg.logic_start is not None and seg.physical(seg.logic_end) >= seg.budget_end


def stored_after(ends: Iterable[tuple[Segment, int | None]], committed: int) -> int:
    """Messages stored at or after ``committed`` in the segments of ``ends``: each with the logic end of what it
    stores (None: not known now, counted as nothing)."""
    total = 0
    for seg, end in ends:
        if end is not None and seg.logic_start is not None:
            total += max(0, end - max(committed, seg.logic_start))
    return total
