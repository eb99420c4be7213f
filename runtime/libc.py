"""System calls Python's os module lacks, from the C library through ctypes (Linux only).

A ctypes call releases the GIL while it runs, as os's own system calls do.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from typing import Any


def function(name: str, argtypes: list[Any], restype: Any = ctypes.c_int) -> Callable[..., Any] | None:
    """The C library's ``name`` with its argument and result types, or None off Linux or when the library lacks it
    (each caller says what it does without: the journal skips its writeback ahead, the broker refuses syncfs)."""
    if not sys.platform.startswith("linux"):
        return None
    # Harmless mutant: the default None dropped (every Linux libc this runs on has the functions used here)
    fn = getattr(ctypes.CDLL(None, use_errno=True), name, None)
    if fn is not None:
        fn.argtypes, fn.restype = argtypes, restype
    return fn


def errno() -> int:
    """The errno of the last call made through ``function`` on this thread."""
    return ctypes.get_errno()
