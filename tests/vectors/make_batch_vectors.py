"""Writes tests/vectors/batch-v2.json from wire/batch.py: ``python -m tests.vectors.make_batch_vectors``.

Run it only when the format's version changes: the file is what clients in other languages check against, and
tests/test_batch_format.py holds the encoder to it byte for byte."""

from __future__ import annotations

import json
import pathlib
import struct

from wire import batch

OUT = pathlib.Path(__file__).with_name("batch-v2.json")


def _m(key, props, body, text) -> batch.Message:
    return batch.Message(key, props, body, text)


SENDS = [
    ("one text message, no key", [_m(None, None, b"hello", True)]),
    ("a keyed binary message with properties", [_m("order-17", {"trace": "a1", "zone": "eu"}, bytes([0, 1, 2, 255]),
                                                   False)]),
    ("three messages: an empty body, a UTF-8 key, a key of zero bytes",
     [_m(None, None, b"", False), _m("clé", None, "né".encode(), True), _m("", {"": ""}, b"x", False)]),
]


def _header(body: bytes, count: int = 1, version: int = batch.VERSION, kind: int = batch.SEND, magic: bytes = b"SB") -> bytes:
    return batch.HEADER.pack(magic, version, kind, count, len(body), batch.crc(body)) + body


def _flipped(raw: bytes, at: int) -> bytes:
    b = bytearray(raw)
    b[at] ^= 0xFF
    return bytes(b)


def _as_json(m: batch.Message) -> dict:
    return {"key": m.key, "props": m.props or {}, "body_hex": m.body.hex(), "text": m.text}


def vectors() -> dict:
    good = batch.encode(SENDS[0][1])
    records = good[batch.HEADER_BYTES:]
    refused = [
        ("a bad CRC", _flipped(good, len(good) - 1)),
        ("short: cut inside the header", good[:10]),
        ("short: cut inside the records", good[:-2]),
        ("version 1, the format before runs", _header(records, version=1)),
        ("a STORED batch sent", _header(records, kind=batch.STORED)),
        ("wrong magic", _header(records, magic=b"XB")),
        ("the count says two, one follows", _header(records, count=2)),
        ("the count says zero", _header(b"", count=0)),
        ("a record's size past the batch (huge length)", _header(struct.pack("<I", 0xFFFFFFF0) + records[4:])),
        ("a body length that does not fill the record", _header(records[:13] + struct.pack("<I", 9) + records[17:])),
        ("a key that is not UTF-8", _header(struct.pack("<IBIII", 15, 0, 2, 0, 0) + b"\xff\xfe")),
    ]
    three = SENDS[2][1]
    sized = batch.check_send(batch.encode(three), count_max=10, record_bytes_max=1 << 20).records
    first_two = len(batch.sized(batch.record(m) for m in three[:2]))
    ts0 = 1_764_000_000_000
    times = [ts0, ts0, ts0 + 5]
    return {
        "format": "docs/batch-format.md", "version": batch.VERSION,
        "crc": "CRC-32C (Castagnoli; crc32c(b'123456789') == 0xe3069283) of the bytes after the 16-byte header",
        "send": [{"description": d, "messages": [_as_json(m) for m in ms], "batch_hex": batch.encode(ms).hex()}
                 for d, ms in SENDS],
        "stored": [
            {"description": "a pull's answer: the three messages above at offsets 41, 42, 43, the first two "
                            "appended together (one run), the third later (a run of its own)",
             "records": [{"offset": 41 + i, "ts_ms": times[i], **_as_json(m)} for i, m in enumerate(three)],
             "batch_hex": batch.encode_stored([batch.Run(41, ts0, 2, sized[:first_two]),
                                               batch.Run(43, ts0 + 5, 1, sized[first_two:])]).hex()},
            {"description": "a pull that found nothing", "records": [], "batch_hex": batch.empty_stored().hex()},
        ],
        "popped": [
            {"description": "a pop's answer: the three messages above delivered from queue 2, the second one again",
             "deliveries": [{"queue": 2, "offset": 41 + i, "attempt": 1 + (i == 1), "handle": f"h{i}.AbC-_",
                             **_as_json(m)} for i, m in enumerate(three)],
             "batch_hex": batch.encode_popped(batch.Popped(2, 41 + i, 1 + (i == 1), f"h{i}.AbC-_", batch.record(m))
                                              for i, m in enumerate(three)).hex()},
            {"description": "a pop that found nothing", "deliveries": [], "batch_hex": batch.encode_popped([]).hex()},
        ],
        "refused": [{"description": d, "batch_hex": raw.hex()} for d, raw in refused],
    }


if __name__ == "__main__":
    OUT.write_text(json.dumps(vectors(), indent=2, ensure_ascii=False) + "\n")
