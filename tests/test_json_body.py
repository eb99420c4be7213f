"""The one JSON parser of bodies from outside (wire/json_body.py) and the encoders behind it: what the parser
lets through, orjson encodes exactly and the same way every time; what it would not, the parser refuses by name."""

from __future__ import annotations

import json

import pytest

from wire import json_body
from wire.errors import ApiError


@pytest.mark.parametrize("raw, says", [
    (b'{"k": NaN}', "not valid JSON"),
    (b'{"k": [1, Infinity]}', "not valid JSON"),
    (b'{"k": -Infinity}', "not valid JSON"),
    (b'{"k": 1e400}', "not finite"),
    (b'{"k": {"j": -1e400}}', "not finite"),
    (b'{"k": 18446744073709551616}', "outside [-2**63, 2**64)"),
    (b'{"k": [-9223372036854775809]}', "outside [-2**63, 2**64)"),
])
def test_numbers_no_encoder_of_ours_carries_are_refused_by_name(raw, says):
    with pytest.raises(ApiError) as e:
        json_body.parse_object(raw)
    assert e.value.status == 400 and e.value.code == "INVALID_ARGUMENT"
    assert says in e.value.message


@pytest.mark.parametrize("value", [2**64 - 1, -2**63, 0, 1.5, -0.0, 1e308, 5e-324, True, None, "é😀", [], {}])
def test_what_the_parser_accepts_encodes_and_reads_back_the_same(value):
    body = json_body.parse_object(json.dumps({"k": value}).encode())
    assert json_body.decode(json_body.encode(body)) == body   # a remembered outcome is kept as its text


def test_canonical_text_sorts_keys_at_every_depth_and_keeps_unicode():
    a = {"b": 1, "a": {"z": [{"y": 1, "x": 2}], "é": "😀"}}
    b = {"a": {"é": "😀", "z": [{"x": 2, "y": 1}]}, "b": 1}
    assert json_body.canonical(a) == json_body.canonical(b)
    # the same text as the stdlib's sort_keys (what history lines and fingerprints were before orjson)
    assert json_body.canonical(a) == json.dumps(a, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def test_the_encoder_refuses_what_json_cannot_hold_instead_of_writing_it():
    for value in ({"k": 2**64}, {"k": "\ud800"}, {"k": {1, 2}}):
        with pytest.raises(TypeError):
            json_body.encode(value)


class ColumnName(str):
    """Like SQLAlchemy's quoted_name: the keys of a row read from the projection."""


def test_keys_that_are_not_exactly_str_are_written_as_the_stdlib_writes_them():
    value = {ColumnName("version"): 3, 7: "seven", "a": [1]}
    assert json_body.encode(value) == json.dumps(value, separators=(",", ":")).encode()
    assert json_body.decode(json_body.canonical(value)) == {"version": 3, "7": "seven", "a": [1]}
