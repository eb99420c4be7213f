"""Group settings pop needs (``max_attempts``), learnt from the ``config`` of meta's ``group`` watch events.

A group meta never heard of (a pop group needs no membership) has the defaults of meta/groups.py CONFIG_DEFAULTS.
"""

from __future__ import annotations

from typing import Any

from wire import group_event

MAX_ATTEMPTS_DEFAULT = 16        # meta/limits.py MAX_ATTEMPTS_DEFAULT
MAX_ATTEMPTS_MAX = 1_000         # meta/limits.py MAX_ATTEMPTS_MAX
GROUPS_REMEMBERED_MAX = 100_000  # meta's GROUPS_MAX is far below


class GroupSettings:
    def __init__(self) -> None:
        self._max_attempts: dict[str, tuple[int, int]] = {}   # group -> (version, max_attempts)

    def apply(self, body: Any) -> None:
        """Take a ``group`` event (wire/group_event.py); an event without a usable config is a no-op."""
        try:
            event = group_event.parse(body, ("config",))
        except group_event.GroupEventError:
            return
        group, version, value = event["group"], event["version"], event["config"].get("max_attempts")
        if type(value) is not int or not 1 <= value <= MAX_ATTEMPTS_MAX:
            return
        old = self._max_attempts.get(group)
        if old is not None and old[0] >= version:
            return
        if old is None and len(self._max_attempts) >= GROUPS_REMEMBERED_MAX:
            return
        self._max_attempts[group] = (version, value)

    def max_attempts(self, group: str) -> int:
        got = self._max_attempts.get(group)
        return got[1] if got is not None else MAX_ATTEMPTS_DEFAULT
