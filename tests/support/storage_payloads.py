"""Record payloads that depend only on their offset, so a reader can check any record it gets back (also imported by
the crash child of tests/test_storage.py).
"""

from __future__ import annotations


def payload(offset: int) -> bytes:
    return f"record-{offset}|".encode() * (1 + offset % 5)
