"""Request parameters shared by the meta service, its HTTP handlers and the broker's: bad ones are 400s."""

from __future__ import annotations

from wire.errors import invalid

PULL_MESSAGES_MAX = 1_000   # messages one pull asks for and a broker answers at most (GET /v1/messages ?max=)


def int_in(raw: object, name: str, default: int | None = None, lo: int = 0, hi: int = 2**62) -> int:
    """An integer within [lo, hi] from a query string or a JSON value (not a bool); ``default`` when absent
    (absent and no default is an error)."""
    if raw is None:
        if default is None:
            raise invalid(f"{name} is required", field=name)
        return default
    try:
        v = int(raw)
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(float("inf")) from a JSON 1e400
        raise invalid(f"{name} must be an integer", field=name) from None
    if isinstance(raw, (bool, float)) or not lo <= v <= hi:
        raise invalid(f"{name} must be within [{lo}, {hi}]", field=name)
    return v


def optional_int(raw: object, name: str) -> int | None:
    """``int_in``'s integer, or None when the parameter is absent (an optional field with no default)."""
    return None if raw is None else int_in(raw, name)


def nonneg_int(raw: str | None, name: str, default: int | None = None) -> int:
    """A non-negative integer; ``default`` when absent (absent and no default is an error)."""
    return int_in(raw, name, default)


def seconds(raw: str | None, name: str, default: float, hi: float) -> float:
    """A duration in seconds within [0, hi]; ``default`` when absent."""
    if raw is None:
        return default
    try:
        v = float(raw)
    except ValueError:
        raise invalid(f"{name} must be a number of seconds", field=name) from None
    if not 0 <= v <= hi:  # also refuses nan
        raise invalid(f"{name} must be within [0, {hi}] seconds", field=name)
    return v
