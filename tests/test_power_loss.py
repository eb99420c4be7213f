"""The power-loss mode (runtime/power_loss.py) on real processes: kill -9, ``lose_unsynced``, start again.

What was acknowledged must survive a power loss: a broker's messages under flush policy fsync (synced per file, or
by group commit's one syncfs for many queues: broker/group_commit.py), committed offsets,
pop acks (the pop journal), and meta writes with journal_sync fsync even when every meta node loses power at once.
The same steps with what does not sync before acknowledging (flush policy interval, journal_sync none) must lose
something, or the mode would not be dropping anything. And the mode is never on by accident.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys

import aiohttp
import pytest

from broker.producers import BATCHES_PER_PRODUCER
from runtime import power_loss
from tests.support import cluster as cluster_mod
from tests.support.meta_http import history, ok, write_configs_until
from tests.support.broker_http import all_writable, read_all, wait_route

FLAGS = [power_loss.FLAG]
SEGMENT_BYTES = 4096           # segments roll every few batches: segment creation and sealed indexes are covered
BATCHES = 40
BATCH = 10
BODY = "x" * 80
PRODUCER = 4242
WAIT_S = 60.0


def data_dir(c, name: str) -> str:
    return os.path.join(c.dir, name, "data")


def ledger_text(c, name: str) -> str:
    with open(os.path.join(data_dir(c, name), power_loss.LEDGER_NAME)) as f:
        return f.read()


async def send_batches(c, topic: str, batches: int, queue: int = 0, sender: int = 0,
                       producer: int | None = None, first: int = 0) -> list[tuple[int, str]]:
    """Batches ``first`` .. ``first + batches - 1``; ``producer``: sent as an idempotent producer of that id, batch i
    with X-Producer-Seq i."""
    r = await wait_route(c, topic, all_writable)
    addr = r["queues"][queue]["address"]
    acked: list[tuple[int, str]] = []
    for i in range(first, first + batches):
        bodies = [f"{queue}-{sender}-{i}-{k}-{BODY}" for k in range(BATCH)]
        headers = {"X-Route-Version": str(r["version"])}   # the broker decides on at least the route read
        if producer is not None:
            headers |= {"X-Producer-Id": str(producer), "X-Producer-Seq": str(i)}
        s, b, _ = await c.call("POST", f"{addr}/v1/messages/{topic}/{queue}", "client",
                               json={"messages": [{"body": x} for x in bodies]}, headers=headers)
        assert s == 200, b
        acked += zip(b["offsets"], bodies)
    return acked


async def power_loss_of(c, name: str, rng: random.Random, tear: bool) -> power_loss.Loss:
    await asyncio.to_thread(c.kill9, name)
    loss = power_loss.lose_unsynced(data_dir(c, name), rng, tear)
    await asyncio.to_thread(c.start, name)
    return loss


@pytest.mark.parametrize("sync_scope", ["filesystem", "file"])
async def test_a_broker_keeps_every_acked_message_offset_and_pop_ack_through_a_torn_power_loss(tmp_path, sync_scope):
    async with cluster_mod.running(str(tmp_path), 1, 1, broker={"segment_bytes_max": SEGMENT_BYTES,
                                                                "sync_scope": sync_scope},
                                   serve_flags=FLAGS) as c:
        await ok(c, "POST", "/v1/topics", json={"topic": "pl", "queues": 1, "brokers": ["b1"]}, expect=(201,))
        acked = await send_batches(c, "pl", BATCHES, producer=PRODUCER)
        b1 = c.url("b1")
        s, b, _ = await c.call("PUT", f"{b1}/v1/offsets/g/pl/0", "client", json={"offset": 123})
        assert s == 200, b
        s, b, _ = await c.call("POST", f"{b1}/v1/pop/pl", "client", json={"group": "p", "max": 7})
        assert s == 200 and len(b["messages"]) == 7, b
        popped = {m["offset"] for m in b["messages"]}
        s, b, _ = await c.call("POST", f"{b1}/v1/ack", "client",
                               json={"group": "p", "handles": [m["handle"] for m in b["messages"]]})
        assert s == 200 and all(r["ok"] for r in b["results"]), b
        # (c): the offsets file and the pop journal report their syncs, as the segments and indexes do
        text = ledger_text(c, "b1")
        for name in ("offsets.log", os.path.join("pop", "journal.log"), "producers.log", ".index", ".log"):
            assert name in text, f"the ledger never saw a sync of {name}"

        loss = await power_loss_of(c, "b1", random.Random(5), tear=True)
        await wait_route(c, "pl", all_writable, timeout_s=WAIT_S)
        got = {(m["offset"], m["body"]) for m in await read_all(c, "pl", 0)}
        missing = [a for a in acked if a not in got]
        assert not missing, f"{len(missing)} acked messages lost in the power loss ({loss}), e.g. {missing[:3]}"
        # The producer heard no answer to its last batches (as many as a broker remembers per producer) and sends
        # them again: each is answered with the offsets it was stored at, and stored once (the producers' batches
        # are durable with the records: broker/producer_journal.py)
        resent = BATCHES_PER_PRODUCER
        assert await send_batches(c, "pl", resent, producer=PRODUCER, first=BATCHES - resent) == \
            acked[-resent * BATCH:], loss
        bodies = [m["body"] for m in await read_all(c, "pl", 0)]
        assert len(bodies) == len(set(bodies)), f"a resent batch was stored twice after the power loss ({loss})"
        s, b, _ = await c.call("GET", f"{b1}/v1/offsets/g/pl/0", "client")
        assert (s, b.get("offset")) == (200, 123), (b, loss)
        s, b, _ = await c.call("POST", f"{b1}/v1/pop/pl", "client", json={"group": "p", "max": 50})
        assert s == 200, b
        back = popped & {m["offset"] for m in b["messages"]}
        assert not back, f"acked pops {sorted(back)} delivered again after the power loss ({loss})"


async def test_a_batch_whose_records_outlived_a_crash_without_its_line_is_answered_not_stored_again(tmp_path):
    """Two files, no order between what reaches the disk of each: a crash may keep a batch's records and lose its
    line in producers.log (a sync of the records' file that began before the line was written, a torn tail kept,
    the kernel's own writeback). The frame's producer mark, walked at the start, stands in for the line (the chaos
    runner, seed 6: a keyed batch synced on b3, its line cut by a power loss, the resend stored after it)."""
    async with cluster_mod.running(str(tmp_path), 1, 1, serve_flags=FLAGS) as c:
        await ok(c, "POST", "/v1/topics", json={"topic": "pm", "queues": 1, "brokers": ["b1"]}, expect=(201,))
        acked = await send_batches(c, "pm", 6, producer=PRODUCER)
        await asyncio.to_thread(c.kill9, "b1")
        path = os.path.join(data_dir(c, "b1"), "producers.log")
        with open(path, "rb") as f:
            kept = f.read().splitlines(keepends=True)[:-3]
        with open(path, "wb") as f:   # the lines of the last three batches are gone, their records are not
            f.write(b"".join(kept))
        await asyncio.to_thread(c.start, "b1")
        await wait_route(c, "pm", all_writable, timeout_s=WAIT_S)
        assert await send_batches(c, "pm", 3, producer=PRODUCER, first=3) == acked[-3 * BATCH:]
        bodies = [m["body"] for m in await read_all(c, "pm", 0)]
        assert sorted(bodies) == sorted(b for _, b in acked), "a resent batch was stored again after the crash"


async def test_the_queues_one_syncfs_covered_together_keep_every_acked_message_through_a_power_loss(tmp_path):
    """Group commit with sends to several queues at once: a round covers many queues, and each queue's acked records
    must be on disk (the ledger records each file a round covered, as it stood before the syncfs)."""
    async with cluster_mod.running(str(tmp_path), 1, 1, broker={"segment_bytes_max": SEGMENT_BYTES},
                                   serve_flags=FLAGS) as c:
        await ok(c, "POST", "/v1/topics", json={"topic": "pl", "queues": 4, "brokers": ["b1"]}, expect=(201,))
        # two senders per queue: a queue is often written while a round that covers it syncs
        sent = await asyncio.gather(*(send_batches(c, "pl", BATCHES // 4, q % 4, q) for q in range(8)))
        loss = await power_loss_of(c, "b1", random.Random(7), tear=True)
        await wait_route(c, "pl", all_writable, timeout_s=WAIT_S)
        for q in range(4):
            acked = sent[q] + sent[q + 4]
            got = {(m["offset"], m["body"]) for m in await read_all(c, "pl", q)}
            missing = [a for a in acked if a not in got]
            assert not missing, f"queue {q}: {len(missing)} acked messages lost ({loss}), e.g. {missing[:3]}"


async def test_a_broker_that_acks_before_its_fsync_loses_acked_messages_in_a_power_loss(tmp_path):
    """Flush policy interval acknowledges before the data is synced: the mode must make that visible."""
    broker = {"flush": "interval", "flush_interval_ms": 60_000, "segment_bytes_max": SEGMENT_BYTES}
    async with cluster_mod.running(str(tmp_path), 1, 1, broker=broker, serve_flags=FLAGS) as c:
        await ok(c, "POST", "/v1/topics", json={"topic": "pl", "queues": 1, "brokers": ["b1"]}, expect=(201,))
        acked = await send_batches(c, "pl", BATCHES)
        loss = await power_loss_of(c, "b1", random.Random(6), tear=False)
        assert loss.bytes_lost > 0 and loss.files_cut > 0, loss
        got = await _readable(c, "pl")
        missing = [a for a in acked if a not in got]
        assert missing, f"every acked message survived though nothing was synced ({loss})"


async def _readable(c, topic: str) -> set[tuple[int, str]]:
    """What the queue still serves from offset 0, wherever its route now starts."""
    r = await wait_route(c, topic, all_writable, timeout_s=WAIT_S)
    addr, out, offset = r["queues"][0]["address"], set(), 0
    for _ in range(1000):
        s, b, _ = await c.call("GET", f"{addr}/v1/messages/{topic}/0?offset={offset}&max=500", "client")
        if s != 200 or b["next_offset"] <= offset:
            return out
        out |= {(m["offset"], m["body"]) for m in b["messages"]}
        offset = b["next_offset"]
    return out


META_WRITERS = 6
WRITE_S = 3.0


async def _meta_power_loss(tmp_path, journal_sync: str, compact: bool = True
                           ) -> tuple[object, dict[int, tuple[str, str]], list]:
    """Three meta nodes (and a broker to own the topic) under writers; then every member loses power at once.
    ``compact``: each node compacts about once a second while the writers run."""
    tuning = {"journal_sync": journal_sync}
    if compact:
        tuning |= {"compaction_min_entries": 200, "compaction_min_time_s": 1}
    c = cluster_mod.up(str(tmp_path), 3, 1, meta={"raft_tuning": tuning}, serve_flags=FLAGS)
    c.session = aiohttp.ClientSession()
    await ok(c, "POST", "/v1/topics", json={"topic": "t", "queues": 1, "brokers": ["b1"]}, expect=(201,))
    acked: dict[int, tuple[str, str]] = {}
    stop = asyncio.Event()
    writing = asyncio.create_task(write_configs_until(c, "t", META_WRITERS, stop, acked, pad=200))
    await asyncio.sleep(WRITE_S)
    # the whole machine: the broker loses power too (restart_all starts a stopped cluster only)
    names = [m["node"] for m in c.info["meta"]] + ["b1"]
    rng = random.Random(7)
    try:
        await asyncio.gather(*(asyncio.to_thread(c.kill9, n) for n in names))
    finally:
        stop.set()
        await writing
    losses = [power_loss.lose_unsynced(data_dir(c, n), rng, tear=rng.random() < 0.5) for n in names]
    return c, acked, losses


async def test_every_meta_node_losing_power_at_once_keeps_every_acked_write_with_journal_sync_fsync(tmp_path):
    c, acked, losses = await _meta_power_loss(tmp_path, "fsync")
    try:
        assert len(acked) > 50, len(acked)
        await asyncio.to_thread(cluster_mod.devcluster.restart_all, c.dir)
        c.reload()
        for url in c.meta_urls:
            events = {e["version"]: e for e in await history(c, url, max(acked))}
            missing = [v for v, (key, value) in acked.items()
                       if events.get(v, {}).get("type") != "TopicConfigChanged"
                       or events[v]["data"]["config"].get(key) != value]
            assert not missing, f"{url} lost {len(missing)} acked writes ({losses}), e.g. {missing[:5]}"
    finally:
        await c.session.close()
        cluster_mod.devcluster.down(c.dir)


async def test_meta_nodes_that_never_sync_their_journal_lose_it_in_a_power_loss(tmp_path):
    # Without compactions: a compaction syncs the journal whatever journal_sync says (its cut must be durable before
    # the state names it, meta/raft/journal.py), so a node killed in the tick after its compaction had nothing
    # unsynced and lost nothing, rightly (CI, 2026-11-27: m2 lost 0 bytes, its last act a snapshot just before).
    c, acked, losses = await _meta_power_loss(tmp_path, "none", compact=False)
    try:
        assert acked, "no write was acknowledged"
        # journal_sync none acknowledges from the page cache: the power loss cuts what every node acknowledged
        assert all(loss.bytes_lost > 0 for loss in losses[:3]), losses
    finally:
        await c.session.close()
        cluster_mod.devcluster.down(c.dir)


def test_the_mode_is_only_on_with_the_flag(tmp_path):
    """No flag, no ledger: a node never loses data by accident; and no config key turns the mode on."""
    cfg = {"broker": "b1", "data_dir": "data", "http": "127.0.0.1:1", "meta": ["http://127.0.0.1:2"],
           "tokens": {"broker": "b" * 32, "client": "c" * 32}, "unsafe_power_loss_ledger": True}
    path = tmp_path / "broker.json"
    path.write_text(json.dumps(cfg))
    done = subprocess.run([sys.executable, "-m", "ops.cli", "broker", "serve", "--config", str(path)],
                          capture_output=True, text=True, timeout=WAIT_S, cwd=os.getcwd())
    assert done.returncode == 2 and "unsafe_power_loss_ledger" in done.stderr, (done.returncode, done.stderr)

    c = cluster_mod.up(str(tmp_path / "plain"), 1, 1)
    try:
        assert not os.path.exists(os.path.join(data_dir(c, "b1"), power_loss.LEDGER_NAME))
        assert not os.path.exists(os.path.join(data_dir(c, "m1"), power_loss.LEDGER_NAME))
        c.kill9("b1")
        assert power_loss.lose_unsynced(data_dir(c, "b1"), random.Random(1), True).as_dict() == \
            power_loss.Loss().as_dict()
    finally:
        cluster_mod.devcluster.down(c.dir)


def test_lose_unsynced_cuts_to_the_last_sync_tears_within_the_lost_tail_and_drops_unsynced_creations(tmp_path):
    """The ledger's rules on files written in this process: no cluster needed."""
    from broker.storage import files
    d = str(tmp_path)
    power_loss.enable(d)
    try:
        synced = os.path.join(d, "synced.log")
        fd = os.open(synced, os.O_RDWR | os.O_CREAT)
        os.write(fd, b"a" * 100)
        files.sync_data(fd)
        os.write(fd, b"b" * 20_000)           # never synced
        os.close(fd)
        sub = os.path.join(d, "q")
        os.mkdir(sub)
        kept, lost = os.path.join(sub, "kept.log"), os.path.join(sub, "lost.log")
        for path in (kept, lost):
            if path == lost:
                files.sync_dir(sub)           # kept's creation is durable, lost's is not
            power_loss.created(path)
            with open(path, "wb") as f:
                f.write(b"c" * 10)
        gone = os.path.join(d, "gone.log")
        power_loss.synced_whole(gone)
        power_loss.removed(gone)
        # A file replaced whole by a rename (raft.state), killed between the rename and its record: the new, longer
        # content at the path is synced whole and must not be cut to the old one's length.
        whole = os.path.join(d, "raft.state")
        with open(whole, "wb") as f:
            f.write(b"e" * 5)
        power_loss.synced_whole(whole)
        with open(whole + ".tmp", "wb") as f:
            f.write(b"f" * 30)
        os.replace(whole + ".tmp", whole)
        with open(gone, "wb") as f:            # a new file at a path the ledger forgot: not cut
            f.write(b"d" * 50)
    finally:
        power_loss.disable()
    loss = power_loss.lose_unsynced(d, random.Random(3), tear=True)
    assert 100 < os.path.getsize(synced) <= 100 + power_loss.TEAR_BYTES_MAX
    with open(synced, "rb") as f:
        assert f.read(101) == b"a" * 100 + b"b", "the torn piece is a prefix of what was written"
    assert os.path.getsize(kept) > 0 and not os.path.exists(lost) and os.path.getsize(gone) == 50
    with open(whole, "rb") as f:
        assert f.read() == b"f" * 30
    assert (loss.files_cut, loss.files_removed, loss.torn) == (2, 1, 2), loss
    assert not os.path.exists(os.path.join(d, power_loss.LEDGER_NAME)), "the ledger is reset"
    assert power_loss.lose_unsynced(d, random.Random(3), tear=True) == power_loss.Loss()


def test_a_syncfs_makes_durable_what_every_file_held_when_it_began_and_nothing_the_code_claims(tmp_path):
    """The ledger learns from the syncfs call itself: every file under the data directory is durable up to its size
    before the call (one the code never named included), a write landing during the call is not, and a file
    written after the last syncfs loses its tail whatever the code believes it synced."""
    from broker.storage import files
    d = str(tmp_path)
    power_loss.enable(d)
    try:
        os.mkdir(os.path.join(d, "queues"))
        named, unnamed, late = (os.path.join(d, "queues", n) for n in ("named.log", "unnamed.log", "late.log"))
        fds = {p: os.open(p, os.O_RDWR | os.O_CREAT) for p in (named, unnamed, late)}
        files.sync_dir(os.path.join(d, "queues"))
        os.write(fds[named], b"a" * 300)
        os.write(fds[unnamed], b"u" * 70)

        def syncfs_while_a_write_lands(fd: int) -> None:
            os.write(fds[named], b"b" * 40)   # after the sizes were taken: not covered
            files._checked_syncfs(fd)

        root = os.open(d, os.O_RDONLY)
        try:
            power_loss.sync_filesystem(root, syncfs_while_a_write_lands)
        finally:
            os.close(root)
        os.write(fds[late], b"c" * 500)          # written after the last syncfs: lost whatever is claimed
        assert power_loss.unsynced_bytes(d) == 40 + 500
        # a syncfs never moves back what an fsync of the file itself made durable
        os.write(fds[unnamed], b"v" * 30)
        files.sync_data(fds[unnamed])
        power_loss.ledger_for(unnamed).record(power_loss.SYNCED_AT_LEAST, 70, unnamed)
        assert power_loss.ledger_for(unnamed).durable(unnamed) == 100
        for fd in fds.values():
            os.close(fd)
    finally:
        power_loss.disable()
    assert power_loss.unsynced_bytes(d) == 40 + 500, "the dry run reads the ledger a stopped node left"
    loss = power_loss.lose_unsynced(d, random.Random(5), tear=False)
    assert (os.path.getsize(named), os.path.getsize(unnamed), os.path.getsize(late)) == (300, 100, 0)
    assert (loss.files_cut, loss.bytes_lost, loss.torn) == (2, 540, 0), loss
    assert power_loss.unsynced_bytes(d) == 0


def test_each_data_directory_has_its_own_ledger_and_a_disabled_one_records_nothing(tmp_path):
    """Several nodes in one process (the simulator's brokers): a sync is recorded in the ledger of the directory its
    file lies in, and only there; once that ledger is disabled (its node crashed) its files' syncs count for
    nothing, while the other's still do."""
    from broker.storage import files
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    power_loss.enable(a)
    power_loss.enable(b)
    try:
        paths = {}
        for d in (a, b):
            paths[d] = os.path.join(d, "x.log")
            fd = os.open(paths[d], os.O_RDWR | os.O_CREAT)
            os.write(fd, b"s" * 10)
            files.sync_data(fd)
            os.write(fd, b"u" * 5)
            os.close(fd)
        assert power_loss.ledger_for(paths[a]).durable(paths[a]) == 10
        assert power_loss.ledger_for(paths[a]).durable(paths[b]) is None   # not a's business
        power_loss.disable(a)
        assert power_loss.ledger_for(paths[a]) is None and power_loss.ledger_for(paths[b]) is not None
        fd = os.open(paths[a], os.O_RDWR)
        files.sync_data(fd)        # after the crash: not recorded
        os.close(fd)
    finally:
        power_loss.disable()
    assert power_loss.ledger_for(paths[b]) is None
    assert power_loss.lose_unsynced(a, random.Random(1), tear=False).bytes_lost == 5
    assert power_loss.lose_unsynced(b, random.Random(1), tear=False).bytes_lost == 5
    assert os.path.getsize(paths[a]) == os.path.getsize(paths[b]) == 10
