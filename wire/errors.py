"""The API's error shape (API.md, Conventions), on both sides of the wire.

Every service answers an error with an HTTP status plus ``{"error": {"code", "message", "details"}}``. A server
raises ``ApiError`` anywhere (``rejection``, ``invalid``, ``too_large``); the error middleware renders it once. A
caller turns the answer back with ``StatorError.from_response`` into the most specific subclass so it can
``except NotLeader:``; codes without a subclass stay plain ``StatorError`` with ``.code`` set. Transport failures
(refused, reset, timed out) are ``Unavailable`` with status 0: the request may or may not have reached the server.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Codes API.md fixes, plus the ones the meta service adds (meta/errors.py, meta/service.py).
INVALID_ARGUMENT = "INVALID_ARGUMENT"
UNAUTHENTICATED = "UNAUTHENTICATED"
PERMISSION_DENIED = "PERMISSION_DENIED"
TOPIC_NOT_FOUND = "TOPIC_NOT_FOUND"
TOPIC_EXISTS = "TOPIC_EXISTS"
VERSION_MISMATCH = "VERSION_MISMATCH"
NOT_LEADER = "NOT_LEADER"
STALE_TOKEN = "STALE_TOKEN"
LOCKS_CATCHING_UP = "LOCKS_CATCHING_UP"
GROUP_NOT_FOUND = "GROUP_NOT_FOUND"
TOO_LARGE = "TOO_LARGE"
NO_LEADER = "NO_LEADER"
FENCED = "FENCED"
SEALING = "SEALING"
VERSION_NOT_REACHED = "VERSION_NOT_REACHED"
TOO_MANY_WAITERS = "TOO_MANY_WAITERS"
LEADER_CHANGED = "LEADER_CHANGED"
IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
UNAVAILABLE = "UNAVAILABLE"  # client-side: no answer (connection refused, reset, timed out)
INTERNAL = "INTERNAL"
# A node's projection still fills a gap of old history from its peers (meta/api/cluster.py).
HISTORY_UNAVAILABLE = "HISTORY_UNAVAILABLE"

# A meta node answering one of these cannot serve the call right now, but another node (or the same one a moment
# later) can: the caller fails over and retries. Mutations are safe to retry because they carry an Idempotency-Key.
META_RETRIABLE_CODES = frozenset({NO_LEADER, VERSION_NOT_REACHED, TOO_MANY_WAITERS, LEADER_CHANGED, UNAVAILABLE,
                                  HISTORY_UNAVAILABLE})


class VersionHeaders:
    """The version headers of an answer (``self.headers``), as numbers."""

    headers: Mapping[str, str]

    def _int_header(self, name: str) -> int | None:
        raw = self.headers.get(name)
        try:
            return int(raw) if raw is not None else None
        except ValueError:
            return None

    @property
    def meta_version(self) -> int | None:
        """``X-Meta-Version``: the applied metadata version of the meta node that answered (or refused)."""
        return self._int_header("X-Meta-Version")

    @property
    def route_version(self) -> int | None:
        """``X-Route-Version``: the route version the broker that answered (or refused) knows."""
        return self._int_header("X-Route-Version")


class StatorError(VersionHeaders, Exception):
    """An error answer of a Stator service (or ``Unavailable`` when there was no answer)."""

    code: str = INTERNAL

    def __init__(self, status: int, code: str | None, message: str, details: dict[str, Any] | None = None,
                 *, url: str | None = None):
        super().__init__(f"{code or self.code} ({status}): {message}")
        self.status = status
        if code is not None:
            self.code = code
        self.message = message
        self.details = details or {}
        self.url = url
        self.headers: Mapping[str, str] = {}  # of the answer, when there was one


    @classmethod
    def from_response(cls, status: int, body: Any, *, url: str | None = None) -> StatorError:
        """Build the most specific error for an answer; tolerates bodies that are not the API error shape."""
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            code = err.get("code") if isinstance(err.get("code"), str) else None
            message = str(err.get("message", ""))
            details = err.get("details") if isinstance(err.get("details"), dict) else {}
        else:
            code, message, details = None, (body if isinstance(body, str) else repr(body))[:500], {}
        if code is None:
            code = _code_for_status(status)
        kind = _BY_CODE.get(code, StatorError)
        return kind(status, code, message, details, url=url)

    @property
    def retriable_on_meta(self) -> bool:
        """True when another try (on another meta node, after a pause) may succeed."""
        return self.code in META_RETRIABLE_CODES or self.status in (502, 504)


class Closed(RuntimeError):
    """The client (or subscription) was closed while a call was using it."""


class Unavailable(StatorError):
    """No answer: connection refused or reset, or the per-request timeout passed. The request may have been applied."""
    code = UNAVAILABLE

    def __init__(self, message: str, *, url: str | None = None, cause: BaseException | None = None):
        super().__init__(0, UNAVAILABLE, message, {}, url=url)
        self.cause = cause


class NotLeader(StatorError):
    """409 from a broker that does not hold the queue's writable (or newest) segment: the client's route is stale."""
    code = NOT_LEADER


class Sealing(StatorError):
    """503: the queue is being remapped (its head segment is sealing); retry on the same queue shortly."""
    code = SEALING


class Fenced(StatorError):
    """503: the broker lost its meta session and refuses writes until it is active again."""
    code = FENCED


class NoLeader(StatorError):
    """503 from meta: no Raft leader right now (an election is running)."""
    code = NO_LEADER


class VersionMismatch(StatorError):
    """409: ``expected_version`` did not match; ``current_version`` is the topic's (or group's) version now."""
    code = VERSION_MISMATCH

    @property
    def current_version(self) -> int | None:
        v = self.details.get("current_version")
        return v if isinstance(v, int) else None


class StaleToken(StatorError):
    """409: a newer exclusive lock grant exists; this consumer must stop using the queue."""
    code = STALE_TOKEN


class LocksCatchingUp(StatorError):
    """503 from a broker that has not yet read the lock tables up to the token it was shown (or, after a restart, up
    to its own registration): it cannot tell a current owner from a stale one yet. Retry shortly."""
    code = LOCKS_CATCHING_UP


class GroupNotFound(StatorError):
    code = GROUP_NOT_FOUND


class TopicNotFound(StatorError):
    code = TOPIC_NOT_FOUND


class TopicExists(StatorError):
    code = TOPIC_EXISTS


_BY_CODE: dict[str, type[StatorError]] = {
    c.code: c for c in (NotLeader, Sealing, Fenced, NoLeader, VersionMismatch, StaleToken, LocksCatchingUp, GroupNotFound,
                      TopicNotFound, TopicExists)
}


def _code_for_status(status: int) -> str:
    return {400: INVALID_ARGUMENT, 401: UNAUTHENTICATED, 403: PERMISSION_DENIED, 413: TOO_LARGE}.get(status, INTERNAL)


# -- raised by a server, rendered by the error middleware (runtime/server.py) ------------------------


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
