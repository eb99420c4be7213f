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

VECTORS = json.loads((pathlib.Path(__file__).parent / "vectors" / "batch-v2.json").read_text())
LIMITS = {"count_max": 10_000, "record_bytes_max": 4 * 1024 * 1024}


def _message(v: dict) -> batch.Message:
    return batch.Message(v["key"], v["props"], bytes.fromhex(v["body_hex"]), v["text"])


@pytest.mark.parametrize("case", VECTORS["send"], ids=lambda c: c["description"])
def test_a_send_vector_encodes_to_its_bytes_and_checks_back(case):
    messages = [_message(m) for m in case["messages"]]
    raw = batch.encode(messages)
    assert raw.hex() == case["batch_hex"]
    send = batch.check_send(raw, **LIMITS)
    assert send.records == raw[batch.HEADER_BYTES:] and send.count == len(messages)
    assert send.keyed == any(m.key is not None for m in messages)
    records = batch.records_of(send.records, send.count)
    assert [batch.message(r) for r in records] == messages
    assert send.record_bytes == sum(map(len, records))


@pytest.mark.parametrize("case", VECTORS["stored"], ids=lambda c: c["description"])
def test_a_stored_vector_decodes_to_its_records(case):
    decoded = batch.decode_stored(bytes.fromhex(case["batch_hex"]))
    assert [(o, ts, m) for o, ts, m in decoded] == [(r["offset"], r["ts_ms"], _message(r)) for r in case["records"]]
    runs: list[batch.Run] = []   # records at consecutive offsets with one time make one run, as a broker answers
    for r in case["records"]:
        rec = batch.sized([batch.record(_message(r))])
        last = runs[-1] if runs else None
        if last and last.ts_ms == r["ts_ms"] and last.offset + last.count == r["offset"]:
            runs[-1] = last._replace(count=last.count + 1, records=last.records + rec)
        else:
            runs.append(batch.Run(r["offset"], r["ts_ms"], 1, rec))
    assert (batch.encode_stored(runs) if runs else batch.empty_stored()).hex() == case["batch_hex"]


@pytest.mark.parametrize("case", VECTORS["popped"], ids=lambda c: c["description"])
def test_a_popped_vector_decodes_to_its_deliveries(case):
    raw = bytes.fromhex(case["batch_hex"])
    want = [(d["queue"], d["offset"], d["attempt"], d["handle"], _message(d)) for d in case["deliveries"]]
    assert batch.decode_popped(raw) == want
    assert batch.encode_popped(batch.Popped(q, o, a, h, batch.record(m)) for q, o, a, h, m in want) == raw


@pytest.mark.parametrize("case", VECTORS["refused"], ids=lambda c: c["description"])
def test_a_damaged_vector_is_refused_with_400(case):
    with pytest.raises(ApiError) as refused:
        batch.check_send(bytes.fromhex(case["batch_hex"]), **LIMITS)
    assert (refused.value.status, refused.value.code) in ((400, "INVALID_ARGUMENT"), (413, "TOO_LARGE"))


def test_an_unknown_version_is_refused_by_name():
    good = bytes.fromhex(VECTORS["send"][0]["batch_hex"])
    for version in (1, 3):
        other = good[:2] + bytes([version]) + good[3:]
        with pytest.raises(ApiError) as refused:
            batch.check_send(other, **LIMITS)
        assert f"version {version}" in refused.value.message and refused.value.details["supported"] == [2]
        with pytest.raises(ApiError) as refused:
            batch.decode_stored(other[:3] + bytes([batch.STORED]) + other[4:])
        assert f"version {version}" in refused.value.message


def test_limits_are_held_at_their_edge():
    one = batch.encode([batch.Message(None, None, b"x" * 100)])
    size = 100 + batch.LEAD_BYTES
    assert batch.check_send(one, count_max=1, record_bytes_max=size).records.endswith(b"x" * 100)
    with pytest.raises(ApiError) as refused:
        batch.check_send(one, count_max=1, record_bytes_max=size - 1)
    assert refused.value.status == 413
    two = batch.encode([batch.Message(None, None, b"")] * 2)
    with pytest.raises(ApiError) as refused:
        batch.check_send(two, count_max=1, record_bytes_max=size)
    assert refused.value.status == 413


texts = st.text(max_size=20)
messages = st.builds(batch.Message, st.none() | texts, st.none() | st.dictionaries(texts, texts, max_size=3),
                     st.binary(max_size=200), st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.lists(messages, min_size=1, max_size=20), st.integers(0, 2**62), st.integers(0, 2**62), st.data())
def test_any_batch_round_trips(ms, first, ts, data):
    send = batch.check_send(batch.encode(ms), **LIMITS)
    assert send.keyed == any(m.key is not None for m in ms)
    records = batch.records_of(send.records, send.count)
    expected = [batch.Message(m.key, dict(m.props or {}), m.body, m.text) for m in ms]
    assert [batch.message(r) for r in records] == expected
    cut = data.draw(st.integers(0, len(records)))   # the records answered as one run or two, with two times
    runs = [batch.Run(first, ts, cut, batch.sized(records[:cut])), batch.Run(first + cut, ts + 1, len(records) - cut,
                                                                         batch.sized(records[cut:]))]
    stored = batch.encode_stored(r for r in runs if r.count)
    assert batch.decode_stored(stored) == [(first + i, ts if i < cut else ts + 1, m) for i, m in enumerate(expected)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**62), st.integers(1, 2**32 - 1),
                          st.text(alphabet="abcXYZ019-_.", max_size=40), messages), max_size=10))
def test_any_pop_answer_round_trips(deliveries):
    raw = batch.encode_popped(batch.Popped(q, o, a, h, batch.record(m)) for q, o, a, h, m in deliveries)
    assert batch.decode_popped(raw) == [(q, o, a, h, batch.Message(m.key, dict(m.props or {}), m.body, m.text))
                                        for q, o, a, h, m in deliveries]


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
        send = batch.check_send(bytes(raw), **LIMITS)
    except ApiError as e:
        assert (e.status, e.code) in ((400, "INVALID_ARGUMENT"), (413, "TOO_LARGE")), e
        return
    # Accepted: then every record reads back whole, as a broker's JSON answer would read it.
    records = batch.records_of(send.records, send.count)
    assert len(records) == send.count and all(isinstance(batch.message(r), batch.Message) for r in records)


@settings(max_examples=500, deadline=None)
@given(st.integers(1, 30), st.integers(0, 60), st.booleans(), st.data())
def test_the_shortcut_for_like_records_accepts_only_what_the_record_walk_accepts(count, body_len, text, data):
    """check_send's shortcut for a batch of records of one size (wire/batch.py _equal_plain_records) compares the
    records' leads by strided slices; whatever it accepts, damaged or not, the walk over each record accepts too."""
    raw = bytearray(batch.encode([batch.Message(None, None, b"b" * body_len, text)] * count))
    assert batch._equal_plain_records(bytes(raw), count, LIMITS["record_bytes_max"]), "the shape it is for"
    stride = len(raw[batch.HEADER_BYTES:]) // count
    for _ in range(data.draw(st.integers(0, 3))):
        if data.draw(st.booleans()):   # a byte of some record's size or lead, where the shortcut looks
            at = batch.HEADER_BYTES + data.draw(st.integers(0, count - 1)) * stride + data.draw(st.integers(0, 16))
        else:
            at = data.draw(st.integers(batch.HEADER_BYTES, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    said = data.draw(st.sampled_from([count, count - 1, count + 1]))
    for limit in (LIMITS["record_bytes_max"], data.draw(st.integers(0, 100))):
        if batch._equal_plain_records(bytes(raw), said, limit):
            assert batch._walked_plain_records(bytes(raw), said, limit)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_are_refused_by_both_decoders(raw):
    for decode in (lambda b: batch.check_send(b, **LIMITS), batch.decode_stored, batch.decode_popped):
        try:
            decode(raw)
        except ApiError as e:
            assert e.status in (400, 413)


def test_the_vectors_file_is_what_the_format_writes():
    from tests.vectors.make_batch_vectors import vectors
    assert vectors() == VECTORS, "run python -m tests.vectors.make_batch_vectors after a change of version"
