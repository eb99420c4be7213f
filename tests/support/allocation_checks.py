"""Reference answers for meta/allocation.py's placement: the fewest moves any balanced rebalance needs.
"""

from __future__ import annotations


def minimal_moves(current: dict[int, str], targets: list[str]) -> int:
    """Fewest moves that leave the queues spread over the targets with counts differing by at most 1.

    The r = n % k targets allowed one extra queue should be those holding the most queues now (exchange argument).
    """
    n, k = len(current), len(targets)
    base, extra = divmod(n, k)
    have = sorted((sum(1 for b in current.values() if b == t) for t in targets), reverse=True)
    kept = sum(min(c, base + (1 if i < extra else 0)) for i, c in enumerate(have))
    return n - kept
