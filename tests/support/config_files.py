"""Settings files for meta nodes and brokers: a valid raw settings object of each kind, changed by keyword, written to
a file.
"""

from __future__ import annotations

import json
import os


TOKENS = {"admin": "a" * 16, "broker": "b" * 16, "client": "c" * 16}
META_TOKENS = {"admin": TOKENS["admin"], "client": TOKENS["client"]}   # brokers: each its own, by hash


def meta_raw(**changes) -> dict:
    raw = {"node": "m1", "data_dir": "data", "http": "127.0.0.1:7100", "secret": "s" * 16, "tokens": dict(META_TOKENS),
           "members": [{"node": "m1", "raft": "127.0.0.1:7101", "url": "http://127.0.0.1:7100"},
                       {"node": "m2", "raft": "127.0.0.1:7103", "url": "http://127.0.0.1:7102/"}]}
    return {**raw, **changes}


def broker_raw(**changes) -> dict:
    raw = {"broker": "b1", "data_dir": "data", "http": "127.0.0.1:7150", "meta": ["http://127.0.0.1:7100"],
           "tokens": {"broker": TOKENS["broker"], "client": TOKENS["client"]}, "flush": "fsync"}
    return {**raw, **changes}


def write(tmp_path, name: str, raw: dict) -> str:
    path = os.path.join(tmp_path, name)
    with open(path, "w") as f:
        json.dump(raw, f)
    return path
