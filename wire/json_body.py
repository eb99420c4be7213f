"""JSON bodies as every Stator service reads them: one parser, with its limits, for meta, broker and client.

API.md says bodies are JSON in UTF-8. Three things that the stdlib parser lets through are refused here with 400
``INVALID_ARGUMENT``, before any handler sees the value:
- bytes that are not strict UTF-8 (``json.loads(bytes)`` would decode them with ``surrogatepass``);
- strings that are not sequences of Unicode scalar values: a ``\\ud800`` escape without its pair parses to a lone
  surrogate, which cannot be encoded again and once stopped every replica that tried to apply it;
- nesting deeper than ``JSON_DEPTH_MAX`` (the C parser recurses: 200,000 ``[`` were a RecursionError, a 500);
- numbers JSON does not have or that no encoder of ours carries exactly: ``NaN``, ``Infinity``, a literal that
  overflows a double (``1e400``), an integer outside [-2**63, 2**64) (orjson's range, see ``encode``).

Values that passed these rules are encoded with orjson (C): the log's entries, canonical text, answers. The stdlib
parser stays for bodies from outside because it reads big integers exactly, so they can be refused by name.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

from wire.errors import invalid

JSON_DEPTH_MAX = 32
INT_MIN, INT_END = -2**63, 2**64   # orjson encodes int64 and uint64; anything else would be a TypeError on the way out
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
        value = _DECODER.decode(text)
    except RecursionError:
        raise invalid(f"{what} nests deeper than {JSON_DEPTH_MAX} levels") from None
    except ValueError as e:
        raise invalid(f"{what} is not valid JSON: {e}") from None
    check(value, what, strings=_SURROGATE_ESCAPE.search(text) is not None)
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


# One decoder for every body: json.loads with a keyword builds a JSONDecoder per call (~1% of a node's CPU at 64
# writers). Its BOM check is not needed here: a leading U+FEFF is no JSON value, so decode refuses it as well.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def parse_object(raw: bytes | str, what: str = "request body") -> dict[str, Any]:
    if not raw:
        raise invalid(f"{what} must be a JSON object")
    value = parse(raw, what)
    if not isinstance(value, dict):
        raise invalid(f"{what} must be a JSON object")
    return value


def check(value: Any, what: str = "value", *, strings: bool = True, depth_max: int = JSON_DEPTH_MAX) -> None:
    """Refuse nesting deeper than ``depth_max``, numbers outside what we encode, and (with ``strings``) any key or
    string that is not scalar text.

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
        elif isinstance(v, str):
            if strings and not is_scalar_text(v):
                raise invalid(f"{what} holds a string that is not valid Unicode (a lone surrogate)")
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise invalid(f"{what} holds a number that is not finite (it overflows a double)")
        elif isinstance(v, int) and not INT_MIN <= v < INT_END:
            raise invalid(f"{what} holds an integer outside [-2**63, 2**64)")


# -- encoding: values that passed the rules above, or that we made ------------------------------------------------
# Keys that are not exactly str are written as the stdlib writes them (an int as its digits, a str subclass such as
# SQLAlchemy's column names as itself); without the option orjson refuses them.
_ENCODE = orjson.OPT_NON_STR_KEYS
_CANONICAL = orjson.OPT_NON_STR_KEYS | orjson.OPT_SORT_KEYS


def encode(value: Any) -> bytes:
    """Compact JSON in UTF-8, key order kept. Raises TypeError for what JSON cannot hold (an int outside
    [-2**63, 2**64), a lone surrogate, an object of another type); a non-finite float would come out as ``null``,
    which ``check`` keeps from reaching here."""
    return orjson.dumps(value, option=_ENCODE)


def canonical(value: Any) -> bytes:
    """Compact JSON with every object's keys sorted: equal values, equal bytes (fingerprints, history lines)."""
    return orjson.dumps(value, option=_CANONICAL)


def decode(raw: bytes | str) -> Any:
    """JSON text that we wrote (a log entry, a peer's answer): ValueError if it is not JSON. An integer outside 64 bits
    would read as a float: none reaches what we write, since ``check`` refuses them in bodies from outside and our
    own numbers are bounded far below (meta/limits.py)."""
    return orjson.loads(raw)

