"""Backup and restore: `stator snapshot save` from a live cluster whose log keeps only a short window (older history
lives in the projections), the old cluster wiped, `stator snapshot restore` into every node of a new one; the new
nodes serve the same image (same digest at the same version), the same whole history, and go on from there."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time

from click.testing import CliRunner

from client import AdminClient
from ops import devcluster
from ops.cli import main
from tests.support import cluster as cluster_mod

NO_ENV = {"STATOR_TOKEN": None, "STATOR_ENDPOINTS": None}
WINDOW = 10   # meta/limits.py HISTORY_WINDOW_MIN: most of the history is outside the image


def cli(*args: str, code: int = 0):
    result = CliRunner().invoke(main, list(args), env=NO_ENV)
    assert result.exit_code == code, (args, result.stdout, result.stderr, result.exception)
    return result


async def _state(urls: list[str], token: str) -> tuple[list[dict], list[dict]]:
    """Each node's image digest, and the whole history as the cluster serves it."""
    digests = []
    for url in urls:
        async with AdminClient(url, token, monotonic_reads=False) as admin:
            digests.append(await admin.image_digest())
    async with AdminClient(urls, token) as admin:
        history = [e async for e in admin.iter_history()]
    return digests, history


def _wait_writable(topic: str, d: list[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        route = json.loads(cli("route", topic, *d).stdout)
        if all(q["writable"] for q in route["queues"]):
            return
        assert time.monotonic() < deadline, f"{topic} never became writable again: {route}"
        time.sleep(0.1)


def test_save_wipe_restore_gives_the_same_image_and_history(tmp_path):
    # A long session: a broker that a loaded machine leaves unheard for a moment must not be fenced mid-test (more
    # events after the save would make the comparison below meaningless).
    old = cluster_mod.up(str(tmp_path / "old"), 3, 1, meta={"history_window": WINDOW, "session_timeout_ms": 60_000})
    backup = str(tmp_path / "meta.backup")
    try:
        d = ["--dir", old.dir, "-w", "json"]
        for i in range(6):
            cli("topic", "create", f"t{i}", "--queues", "2", *d)
            cli("topic", "config", f"t{i}", f"owner=team{i}", *d)
        cli("topic", "grow", "t0", "--queues", "3", *d)
        # The growth seals queue 0 and the broker reports the seal in its own time (two more events): the backup is
        # compared with the cluster's state after it, so the cluster must be still by then.
        _wait_writable("t0", d)
        header = json.loads(cli("snapshot", "save", backup, *d).stdout)
        digests, history = asyncio.run(_state(old.meta_urls, old.token("admin")))
    finally:
        devcluster.down(old.dir)
    shutil.rmtree(old.dir)   # the old cluster is gone: only the backup file is left

    assert header["meta_version"] == history[-1]["version"] > WINDOW
    assert header["history_through"] == header["events"] > 0   # versions outside the image's window were saved
    assert {(x["version"], x["sha256"]) for x in digests} == {(header["meta_version"], header["image_sha256"])}

    new = cluster_mod.up(str(tmp_path / "new"), 3, 0, meta={"history_window": WINDOW, "session_timeout_ms": 60_000})
    try:
        devcluster.down(new.dir)
        for m in new.info["meta"]:
            data_dir = os.path.join(new.dir, m["node"], "data")
            shutil.rmtree(data_dir)
            out = json.loads(cli("snapshot", "restore", backup, "--data-dir", data_dir, "--node", m["node"],
                                 "-w", "json").stdout)
            assert out["meta_version"] == header["meta_version"] and out["projection_position"] == len(history)
        # Restoring over a node's state is refused, and so is a damaged file.
        busy = os.path.join(new.dir, "m1", "data")
        err = cli("snapshot", "restore", backup, "--data-dir", busy, "--node", "m1", code=1).stderr
        assert err.startswith("error: BACKUP_INVALID: ") and "not empty" in err and err.count("\n") == 1
        damaged = str(tmp_path / "damaged.backup")
        raw = bytearray(open(backup, "rb").read())
        raw[-10] ^= 0xFF
        open(damaged, "wb").write(bytes(raw))
        err = cli("snapshot", "restore", damaged, "--data-dir", str(tmp_path / "x"), "--node", "m1", code=1).stderr
        assert "damaged" in err and not os.path.exists(tmp_path / "x")

        devcluster.up(new.dir)
        new.reload()
        new_digests, new_history = asyncio.run(_state(new.meta_urls, new.token("admin")))
        assert {(x["version"], x["sha256"]) for x in new_digests} == {(header["meta_version"],
                                                                      header["image_sha256"])}
        assert new_history == history
        # The new cluster goes on from the backup's version.
        after = json.loads(cli("topic", "config", "t1", "owner=restored", "--dir", new.dir, "-w", "json").stdout)
        assert after["version"] == header["meta_version"] + 1 and after["config"] == {"owner": "restored"}
    finally:
        devcluster.down(new.dir)
