"""A data directory has an identity: a random id written once, when the directory is first used.

A meta node and a broker each promise never to forget what they acknowledged. A disk that was wiped or replaced
forgets everything, so the log records the disk id each one holds its data on:
- a meta voter whose disk id is not the one the membership (``meta/raft/membership.py``) records is a learner until
  the log says otherwise (KRaft's directory ids, KIP-853);
- a broker registers with its disk id (``meta/deciders/brokers.py``): back on the disk it had, it keeps its copies
  and its places in the in-sync sets; back on another, it lost them and catches up first (KIP-858's directory ids).
The file is written whole and synced (temp file, fsync, rename, directory fsync) before the process touches its
data: a directory that lost it gets a new id, which is always safe (what it held is taken as lost).
"""

from __future__ import annotations

import json
import os
import secrets

IDENTITY_FILE = "disk.id"
FORMAT = "stator-disk-identity"
VERSION = 1
DISK_ID_HEX_CHARS = 32
FILE_BYTES_MAX = 4096


class DiskIdentityError(RuntimeError):
    """The identity file exists but is not one this version reads: refused by name, never replaced silently."""


def new_disk_id() -> str:
    return secrets.token_hex(DISK_ID_HEX_CHARS // 2)


def is_disk_id(value: object) -> bool:
    return (isinstance(value, str) and len(value) == DISK_ID_HEX_CHARS
            and all(c in "0123456789abcdef" for c in value))


def load_or_create(data_dir: str) -> tuple[str, bool]:
    """This directory's disk id, and whether it was created just now."""
    path = os.path.join(data_dir, IDENTITY_FILE)
    os.makedirs(data_dir, exist_ok=True)
    try:
        with open(path, "rb") as f:
            raw = f.read(FILE_BYTES_MAX + 1)
    except FileNotFoundError:
        disk = new_disk_id()
        _write(data_dir, path, disk)
        return disk, True
    try:
        doc = json.loads(raw) if len(raw) <= FILE_BYTES_MAX else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise DiskIdentityError(f"{path}: not a Stator disk identity file (format {FORMAT!r} expected)")
    if doc.get("version") != VERSION:
        raise DiskIdentityError(f"{path}: disk identity version {doc.get('version')!r}; this Stator reads "
                                f"version {VERSION} only")
    if not is_disk_id(doc.get("disk")):
        raise DiskIdentityError(f"{path}: the disk id is not {DISK_ID_HEX_CHARS} lowercase hex characters")
    return doc["disk"], False


def _write(data_dir: str, path: str, disk: str) -> None:
    tmp = path + ".tmp"
    data = json.dumps({"format": FORMAT, "version": VERSION, "disk": disk}).encode() + b"\n"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
