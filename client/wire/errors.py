"""Errors with their HTTP status and API.md code. Raised anywhere; rendered once by the error middleware."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
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
    def from_dict(cls, status: int, body: Any) -> "ApiError":
        err = body.get("error") if isinstance(body, dict) else None
        if not isinstance(err, dict):
            return cls(f"answer without an error body (HTTP {status})", code="INTERNAL", status=status)
        return cls(str(err.get("message", "")), err.get("details") if isinstance(err.get("details"), dict) else None,
                   code=str(err.get("code", "INTERNAL")), status=status)


def rejection(status: int, code: str, message: str, **details: Any) -> ApiError:
    return ApiError(message, details, code=code, status=status)


def invalid(message: str, **details: Any) -> ApiError:
    return ApiError(message, details, code="INVALID_ARGUMENT", status=400)


def too_large(message: str, **details: Any) -> ApiError:
    return ApiError(message, details, code="TOO_LARGE", status=413)
