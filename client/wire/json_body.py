"""JSON bodies as every Stator service reads them: one parser, with its limits, for meta, broker and client.

API.md says bodies are JSON in UTF-8. Three things that the stdlib parser lets through are refused here with 400
``INVALID_ARGUMENT``, before any handler sees the value:
- bytes that are not strict UTF-8 (``json.loads(bytes)`` would decode them with ``surrogatepass``);
- strings that are not sequences of Unicode scalar values: a ``\\ud800`` escape without its pair parses to a lone
  surrogate, which cannot be encoded again and once stopped every replica that tried to apply it;
- nesting deeper than ``JSON_DEPTH_MAX`` (the C parser recurses: 200,000 ``[`` were a RecursionError, a 500).
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import invalid

JSON_DEPTH_MAX = 32
# A lone surrogate can only come from a \uD800-\uDFFF escape once the bytes decoded as strict UTF-8; a valid pair is
# joined by the parser into one scalar value, so the slow walk over strings runs only when such an escape appears.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def is_scalar_text(s: str) -> bool:
    """True if ``s`` is a sequence of Unicode scalar values (no lone surrogates): encodable as UTF-8."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse(raw: bytes | str, what: str = "request body") -> Any:
    """Parse JSON text under the rules above; any violation is a 400 naming ``what``."""
    if isinstance(raw, (bytes, bytearray)):
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise invalid(f"{what} is not valid UTF-8") from None
    else:
        text = raw
    try:
        value = json.loads(text)
    except RecursionError:
        raise invalid(f"{what} nests deeper than {JSON_DEPTH_MAX} levels") from None
    except ValueError as e:
        raise invalid(f"{what} is not valid JSON: {e}") from None
    check(value, what, strings=_SURROGATE_ESCAPE.search(text) is not None)
    return value


def parse_object(raw: bytes | str, what: str = "request body") -> dict[str, Any]:
    if not raw:
        raise invalid(f"{what} must be a JSON object")
    value = parse(raw, what)
    if not isinstance(value, dict):
        raise invalid(f"{what} must be a JSON object")
    return value


def check(value: Any, what: str = "value", *, strings: bool = True, depth_max: int = JSON_DEPTH_MAX) -> None:
    """Refuse nesting deeper than ``depth_max`` and (with ``strings``) any key or string that is not scalar text.

    Iterative, so no input can exhaust the stack. Also used inside apply, on values that came through the log.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            if depth > depth_max:
                raise invalid(f"{what} nests deeper than {depth_max} levels")
            for k, x in v.items():
                if strings and isinstance(k, str) and not is_scalar_text(k):
                    raise invalid(f"{what} holds a key that is not valid Unicode (a lone surrogate)")
                stack.append((x, depth + 1))
        elif isinstance(v, list):
            if depth > depth_max:
                raise invalid(f"{what} nests deeper than {depth_max} levels")
            stack.extend((x, depth + 1) for x in v)
        elif strings and isinstance(v, str) and not is_scalar_text(v):
            raise invalid(f"{what} holds a string that is not valid Unicode (a lone surrogate)")
