"""The log's own entries, which decide nothing about brokers, topics or groups: ``Barrier``, the no-op a
linearizable read proposes and waits to see applied (meta/reads.py), and the history window the leader stamps on
every envelope (``set_window``: every replica trims its history at the same entries; meta/image.py keeps it).
"""

from __future__ import annotations

from ..image import Image
from . import Decider


def set_window(image: Image, window: int) -> None:
    """The leader's history window (its config), decided here so every replica trims at the same entries."""
    image.data["history_window"] = window


def barrier(image: Image, c, ts, budget):
    return [], {}


DECIDERS: dict[str, Decider] = {
    "Barrier": barrier,
}
