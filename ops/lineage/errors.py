"""The one error lineage commands raise for something the operator must act on: ``CODE: message`` on one line."""

from __future__ import annotations


class LineageError(RuntimeError):
    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
