"""Backups of the meta state: the image at one version plus the whole history before its window, in one checksummed
file (`stator snapshot save`), and seeding a new node's data directory from it (`stator snapshot restore`).

The file::

    {"format": "stator-backup", "version": 3, "meta_version": V, "image_sha256": "...", "history_through": S,
     "events": N, "payload_bytes": B, "payload_sha256": "..."}\\n
    <B bytes: gzip'd JSON {"image": {...}, "history": [events 1..S]}>

It is consistent: the image is one node's state at version V, and the history before the image's window
(versions 1..S, S = history_start - 1) is immutable, read from any node (meta/api/cluster.py serves it whole) and
checked to join the image's window exactly. Restore checks the payload's checksum and the image's digest before it
writes anything, and refuses a data directory that already holds a node's state.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import time
from typing import Any

from .raft import pysyncobj_shim as shim
from .raft import snapshot_file
from .image import Image
from .raft.journal import journal_exists
from .raft.node import SNAPSHOT_FILE

FORMAT = "stator-backup"
FORMAT_VERSION = 3            # 2: each broker of the image names its disk (wire/disk_identity.py); 3: a remembered
                              # request's outcome is its JSON text (meta/state_machine.py _remember)
HEADER_BYTES_MAX = 4096
PAGE_EVENTS = 1000            # history read per request while saving
GZIP_LEVEL = 6


class BackupError(ValueError):
    """A backup that cannot be made, or a file that is not a whole, intact backup."""


def image_digest(image_data: dict[str, Any]) -> str:
    """What /v1/admin/image-digest answers for this image: SHA-256 of its canonical bytes."""
    return hashlib.sha256(Image(image_data).canonical_bytes()).hexdigest()


async def save(admin: Any, path: str) -> dict[str, Any]:
    """Write a backup of the cluster ``admin`` talks to at ``path`` (atomically); returns the header."""
    from .projection.sources import SourceError, peer_pages
    image, version, sha = await admin.image()
    if image_digest(image) != sha:
        raise BackupError(f"the image received (version {version}) does not match its digest: try again")
    start = image["history_start"]
    history: list[dict[str, Any]] = []
    first = json.loads(image["history"][0]) if image["history"] else None
    through = start if first is not None else start - 1
    try:
        async for page in peer_pages(admin, 0, through, PAGE_EVENTS):
            history.extend(page)
    except SourceError as e:
        raise BackupError(f"the history before the image's window is not whole: {e}") from None
    if first is not None and start > 0 and history and history[-1]["version"] == start:
        if history.pop() != first:   # where the two meet they must be the same event: the same log
            raise BackupError(f"the history at version {start} differs from the image's: try again")
    payload = gzip.compress(json.dumps({"image": image, "history": history}, separators=(",", ":")).encode(),
                            GZIP_LEVEL)
    header = {"format": FORMAT, "version": FORMAT_VERSION, "meta_version": version, "image_sha256": sha,
              "history_through": start - 1, "events": len(history), "saved_ms": int(time.time() * 1000),
              "payload_bytes": len(payload), "payload_sha256": hashlib.sha256(payload).hexdigest()}
    tmp = path + ".writing"
    with open(tmp, "wb") as f:
        f.write(json.dumps(header).encode() + b"\n")
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return header


def read(path: str) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """``(header, image, history)`` of a backup file, every checksum verified."""
    try:
        with open(path, "rb") as f:
            line = f.readline(HEADER_BYTES_MAX + 1)
            payload = f.read()
    except OSError as e:
        raise BackupError(f"{path}: cannot read: {e.strerror}") from None
    try:
        header = json.loads(line)
        ok = isinstance(header, dict) and header.get("format") == FORMAT
    except ValueError:
        ok = False
    if not ok:
        raise BackupError(f"{path}: not a Stator backup")
    if header.get("version") != FORMAT_VERSION:
        raise BackupError(f"{path}: backup format version {header.get('version')}, this build reads {FORMAT_VERSION}")
    if len(payload) != header["payload_bytes"] or hashlib.sha256(payload).hexdigest() != header["payload_sha256"]:
        raise BackupError(f"{path}: damaged: its contents do not match the checksum in its header")
    body = json.loads(gzip.decompress(payload))
    image, history = body["image"], body["history"]
    if image_digest(image) != header["image_sha256"] or image["version"] != header["meta_version"]:
        raise BackupError(f"{path}: the image does not match its digest")
    versions = [e["version"] for e in history]
    if versions != list(range(1, header["history_through"] + 1)):
        raise BackupError(f"{path}: the history is not versions 1..{header['history_through']}")
    return header, image, history


def restore(path: str, data_dir: str, node: str, projection_url: str | None = None) -> dict[str, Any]:
    """Seed ``data_dir`` (new or empty) of meta node ``node`` with the backup: the image as the node's Raft snapshot,
    the whole history in its projection. Every node of the new cluster is seeded from the same file; they start
    with the same log (``shim.seed_entries``), elect a leader, and go on from the backup's version."""
    from .offline_log import apply_image_history
    from .projection import APPLY_BATCH_MAX, SqlProjection
    header, image, history = read(path)
    if os.path.isdir(data_dir) and os.listdir(data_dir):
        raise BackupError(f"{data_dir} is not empty: restore seeds a new node only (move the old data away first)")
    os.makedirs(data_dir, exist_ok=True)
    last, previous = shim.seed_entries()
    # A restored cluster is a new one: its nodes bootstrap their own membership (meta/raft/membership.py) with the
    # disks they have, not the voters of the cluster the backup was taken from.
    image["members"] = []
    projection = SqlProjection(projection_url or f"sqlite:///{os.path.join(data_dir, 'projection.db')}")
    try:
        projection.migrate()
        if projection.position() != 0:
            raise BackupError("the projection database already holds events: restore seeds a new node only")
        for i in range(0, len(history), APPLY_BATCH_MAX):
            projection.apply(history[i:i + APPLY_BATCH_MAX])
        apply_image_history(projection, Image(image))
        position = projection.position()
    finally:
        projection.close()
    snapshot_file.write(os.path.join(data_dir, SNAPSHOT_FILE), snapshot_file.Snapshot(image, last, previous, ()))
    assert not journal_exists(data_dir)
    return {"node": node, "data_dir": data_dir, "meta_version": header["meta_version"],
            "image_sha256": header["image_sha256"], "projection_position": position}
