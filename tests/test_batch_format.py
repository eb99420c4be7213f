"""The binary batch format (wire/batch.py, docs/batch-format.md): the test vectors a client in another language
checks against, round trips of any message, and a decoder that refuses damage by name and never anything else."""

from __future__ import annotations

import json
import pathlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wire import batch
from wire.errors import ApiError

VECTORS = json.loads((pathlib.Path(__file__).parent / "vectors" / "batch-v1.json").read_text())
LIMITS = {"count_max": 10_000, "record_bytes_max": 4 * 1024 * 1024}


def _message(v: dict) -> batch.Message:
    return batch.Message(v["key"], v["props"], bytes.fromhex(v["body_hex"]), v["text"])


@pytest.mark.parametrize("case", VECTORS["send"], ids=lambda c: c["description"])
def test_a_send_vector_encodes_to_its_bytes_and_splits_back(case):
    messages = [_message(m) for m in case["messages"]]
    raw = batch.encode(messages)
    assert raw.hex() == case["batch_hex"]
    records, keys = batch.split(raw, **LIMITS)
    assert keys == [m.key for m in messages]
    assert [batch.message(r) for r in records] == messages


@pytest.mark.parametrize("case", VECTORS["stored"], ids=lambda c: c["description"])
def test_a_stored_vector_decodes_to_its_records(case):
    decoded = batch.decode_stored(bytes.fromhex(case["batch_hex"]))
    assert [(o, ts, m) for o, ts, m in decoded] == [(r["offset"], r["ts_ms"], _message(r)) for r in case["records"]]
    stored = [batch.Stored(r["offset"], r["ts_ms"], batch.record(_message(r))) for r in case["records"]]
    assert (batch.encode_stored(stored) if stored else batch.empty_stored()).hex() == case["batch_hex"]


@pytest.mark.parametrize("case", VECTORS["refused"], ids=lambda c: c["description"])
def test_a_damaged_vector_is_refused_with_400(case):
    with pytest.raises(ApiError) as refused:
        batch.split(bytes.fromhex(case["batch_hex"]), **LIMITS)
    assert (refused.value.status, refused.value.code) in ((400, "INVALID_ARGUMENT"), (413, "TOO_LARGE"))


def test_an_unknown_version_is_refused_by_name():
    good = bytes.fromhex(VECTORS["send"][0]["batch_hex"])
    v2 = good[:2] + bytes([2]) + good[3:]
    with pytest.raises(ApiError) as refused:
        batch.split(v2, **LIMITS)
    assert "version 2" in refused.value.message and refused.value.details["supported"] == [1]


def test_limits_are_held_at_their_edge():
    one = batch.encode([batch.Message(None, None, b"x" * 100)])
    size = 100 + batch.LEAD_BYTES
    assert batch.split(one, count_max=1, record_bytes_max=size)[0][0].endswith(b"x" * 100)
    with pytest.raises(ApiError) as refused:
        batch.split(one, count_max=1, record_bytes_max=size - 1)
    assert refused.value.status == 413
    two = batch.encode([batch.Message(None, None, b"")] * 2)
    with pytest.raises(ApiError) as refused:
        batch.split(two, count_max=1, record_bytes_max=size)
    assert refused.value.status == 413


texts = st.text(max_size=20)
messages = st.builds(batch.Message, st.none() | texts, st.none() | st.dictionaries(texts, texts, max_size=3),
                     st.binary(max_size=200), st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.lists(messages, min_size=1, max_size=20), st.integers(0, 2**62), st.integers(0, 2**62))
def test_any_batch_round_trips(ms, first, ts):
    records, keys = batch.split(batch.encode(ms), **LIMITS)
    assert keys == [m.key for m in ms]
    expected = [batch.Message(m.key, dict(m.props or {}), m.body, m.text) for m in ms]
    assert [batch.message(r) for r in records] == expected
    stored = batch.encode_stored(batch.Stored(first + i, ts, r) for i, r in enumerate(records))
    assert batch.decode_stored(stored) == [(first + i, ts, m) for i, m in enumerate(expected)]


def _reframed(body: bytes, count: int) -> bytes:
    """A header that agrees with ``body``: the damage is then inside the records, past the CRC's reach."""
    return batch.HEADER.pack(batch.MAGIC, batch.VERSION, batch.SEND, count, len(body), batch.crc(body)) + body


@settings(max_examples=500, deadline=None)
@given(st.lists(messages, min_size=1, max_size=5), st.data())
def test_a_damaged_batch_is_refused_or_read_whole_never_anything_else(ms, data):
    raw = bytearray(batch.encode(ms))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):   # mend the header, so the records' own checks are reached
        count = struct.unpack_from("<I", raw, 4)[0]
        raw = bytearray(_reframed(bytes(raw[batch.HEADER_BYTES:]), count))
    try:
        records, keys = batch.split(bytes(raw), **LIMITS)
    except ApiError as e:
        assert (e.status, e.code) in ((400, "INVALID_ARGUMENT"), (413, "TOO_LARGE")), e
        return
    # Accepted: then every record reads back whole, as a broker's JSON answer would read it.
    assert len(keys) == len(records) and all(isinstance(batch.message(r), batch.Message) for r in records)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_are_refused_by_both_decoders(raw):
    for decode in (lambda b: batch.split(b, **LIMITS), batch.decode_stored):
        try:
            decode(raw)
        except ApiError as e:
            assert e.status in (400, 413)


def test_the_vectors_file_is_what_the_format_writes():
    from tests.vectors.make_batch_vectors import vectors
    assert vectors() == VECTORS, "run python -m tests.vectors.make_batch_vectors after a change of version"
