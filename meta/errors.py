"""Errors with their HTTP status and API.md code. Raised anywhere; rendered once by the HTTP layer."""

from __future__ import annotations

from typing import Any


class MetaError(Exception):
    status = 400
    code = "INVALID_ARGUMENT"

    def __init__(self, message: str, details: dict[str, Any] | None = None, *, code: str | None = None,
                 status: int | None = None):
        super().__init__(message)
        self.message = message
        self.details = details or {}
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status

    def to_dict(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}

    @classmethod
    def from_dict(cls, status: int, body: dict[str, Any]) -> "MetaError":
        err = body.get("error", {})
        return cls(err.get("message", ""), err.get("details"), code=err.get("code", "INTERNAL"), status=status)


def rejection(status: int, code: str, message: str, **details: Any) -> MetaError:
    return MetaError(message, details, code=code, status=status)


def invalid(message: str, **details: Any) -> MetaError:
    return MetaError(message, details, code="INVALID_ARGUMENT", status=400)
