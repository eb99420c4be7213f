"""A disk that fails: what tests put in place of a write or sync to see the error path."""

from __future__ import annotations

import errno
from typing import NoReturn


def eio(*_args: object, **_kwargs: object) -> NoReturn:
    """Any write or sync the disk failed (EIO)."""
    raise OSError(errno.EIO, "Input/output error")
