"""Helpers of tests/test_pop_edges.py: handles signed with a codec's own key around any body (what a handle with a
valid MAC but a bad body looks like, which no client can make), and a monotonic clock the test moves."""

from __future__ import annotations

import time
from types import SimpleNamespace

from broker.pop.handles import HandleCodec


def signed(codec: HandleCodec, group: str, body: str) -> str:
    """``body`` with the MAC ``codec`` would give it for ``group``: it passes the MAC check, whatever it holds."""
    return body + "." + codec._mac(group, body)


class Clock:
    """A ``time`` module stand-in for broker/pop/service.py: ``monotonic`` is the test's, ``time`` the real one."""

    def __init__(self, start: float = 1000.0):
        self.now = start

    def monotonic(self) -> float:
        return self.now

    def module(self) -> SimpleNamespace:
        return SimpleNamespace(monotonic=self.monotonic, time=time.time)
