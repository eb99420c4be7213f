"""The projection's writes run in a child process (meta/projection/writer_process.py): it answers as the store
does, its refusals arrive as the same exceptions, a dead one is started again, and it ends with its node."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from meta.projection import ProjectionGap, SqlProjection
from meta.projection import writer_zygote
from meta.gc_tuning import GC_THRESHOLDS
from meta.projection.writer_process import WriterProcess
from ops.bench import common, scale
from tests.support import cluster as cluster_mod
from tests.support.meta_http import wait_until
from tests.support.state_machine_builders import Log

WAIT_S = 60.0


def _lines() -> list[str]:
    log = Log()
    log.register("a")
    log.create("t", 400)   # a creation past history_lines.PACK_MIN_CHARS: kept packed by the image
    for i in range(5):
        log.ok({"type": "SetTopicConfig", "topic": "t", "config": {"k": str(i)}})
    return log.sm.image.history_after(0, 100)


@pytest.fixture
def writer(tmp_path):
    w = WriterProcess(f"sqlite:///{tmp_path / 'projection.db'}")
    w.migrate()
    yield w
    w.close()


def test_the_writer_applies_lines_and_answers_as_the_store_does(writer, tmp_path):
    lines = _lines()
    assert writer.position() == 0 and writer.first_hole() is None
    assert writer.apply_lines(lines[:3]) == 3
    assert writer.apply([json.loads(line) for line in lines[3:]]) == len(lines)
    assert writer.apply_lines(lines) == len(lines), "applying again is a no-op by version"
    reader = SqlProjection(f"sqlite:///{tmp_path / 'projection.db'}")
    try:
        ours = reader.history(after=0, limit=100)
    finally:
        reader.close()
    assert [e["version"] for e in ours] == list(range(1, len(lines) + 1))
    assert ours == writer.history(after=0, limit=100)
    assert ours[1]["type"] == "TopicCreated" and len(ours[1]["data"]["segments"]) == 400


def test_the_writer_keeps_what_it_started_with_out_of_its_collections(writer):
    # Its imports would otherwise be walked by every full collection (~15% of a writer's CPU under small writes).
    frozen, thresholds = writer.gc_state()
    assert frozen > 10_000, frozen
    assert thresholds == GC_THRESHOLDS


def test_a_refusal_in_the_child_is_the_same_exception_here(writer):
    lines = _lines()
    writer.apply_lines(lines[:2])
    with pytest.raises(ProjectionGap) as e:
        writer.apply_lines(lines[3:5])
    assert (e.value.first, e.value.last) == (3, 3)
    with pytest.raises(ValueError, match="history limit"):
        writer.history(limit=0)
    assert writer.position() == 2, "a refused apply changed nothing"


def test_a_writer_that_died_is_started_again_by_the_next_call(writer):
    writer.apply_lines(_lines()[:2])
    first = writer.pid
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + WAIT_S
    while not _gone(first) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert writer.position() == 2
    assert writer.pid != first


def test_close_ends_the_child(writer):
    writer.position()
    pid = writer.pid
    writer.close()
    assert _gone(pid)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] in "ZX"   # a zombie has ended; its parent has not reaped it yet
    except FileNotFoundError:
        return True


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def _zygote_and_writers(node_pid: int) -> tuple[int, list[int]] | None:
    """The node's writer zygote (its one child, meta/projection/writer_zygote.py) and the writers it forked."""
    children = common.children(node_pid)
    if len(children) != 1:
        return None
    return children[0], common.children(children[0])


async def test_a_node_writes_its_projection_from_a_child_that_ends_with_the_node(tmp_path):
    # The writer is forked by the node's zygote (meta/projection/writer_zygote.py), which the node forked first
    # thing: node -> zygote -> writer. A writer killed is forked again by the next call; all of it ends with the node.
    async with cluster_mod.running(str(tmp_path), metas=1) as c:
        node = c.info["meta"][0]["node"]
        pid = c.pid(node)

        # Named (a fork renames itself first thing), as they keep the node's command line: how ps and
        # ops/bench/scale.py tell them from pysyncobj's snapshot writers
        async def writers():
            found = _zygote_and_writers(pid)
            named = found is not None and found[1] and common.process_name(found[1][0]) == writer_zygote.WRITER_NAME
            return found if named else None
        zygote, children = await wait_until(writers, WAIT_S,
                                            f"the projection writer, named {writer_zygote.WRITER_NAME}")
        assert len(children) == 1
        assert common.process_name(zygote) == writer_zygote.ZYGOTE_NAME
        assert scale._snapshot_writers(pid) == [] and scale.node_memory(pid)["projection_writer"] > 0
        os.kill(children[0], signal.SIGKILL)
        killed = children[0]
        async with c.session.put(c.meta_urls[0] + "/v1/brokers/b1", json={"address": "http://127.0.0.1:1"},
                                 headers=c.headers("broker")) as r:
            assert r.status == 200, await r.text()

        async def projected():
            async with c.session.get(c.meta_urls[0] + "/readyz") as r:
                body = await r.json()
            return body["projection_position"] >= 1
        await wait_until(projected, WAIT_S, "the projection to take the registration")
        again, children = _zygote_and_writers(pid)
        assert again == zygote and len(children) == 1 and children[0] != killed and _gone(killed)
        # A big creation: its history line is kept packed by the image and must reach the projection whole.
        async with c.session.post(c.meta_urls[0] + "/v1/topics", json={"topic": "big", "queues": 400},
                                  headers=c.headers("admin")) as r:
            assert r.status == 201, await r.text()
            created = (await r.json())["version"]

        async def big_projected():
            async with c.session.get(c.meta_urls[0] + "/readyz") as r:
                return (await r.json())["projection_position"] >= created
        await wait_until(big_projected, WAIT_S, "the projection to take the big creation")
        reader = SqlProjection(f"sqlite:///{os.path.join(c.dir, node, 'data', 'projection.db')}")
        try:
            event = next(e for e in reader.history(after=0, limit=100) if e["type"] == "TopicCreated")
        finally:
            reader.close()
        assert len(event["data"]["segments"]) == 400
        # With its zygote gone too, the node starts its next writer afresh (python -m ...writer_process).
        os.kill(zygote, signal.SIGKILL)
        os.kill(children[0], signal.SIGKILL)
        async with c.session.put(c.meta_urls[0] + "/v1/topics/big/config", json={"k": "v"},
                                 headers=c.headers("admin")) as r:
            assert r.status == 200, await r.text()
            changed = (await r.json())["version"]

        async def change_projected():
            async with c.session.get(c.meta_urls[0] + "/readyz") as r:
                return (await r.json())["projection_position"] >= changed
        await wait_until(change_projected, WAIT_S, "the projection to take the change through a writer started afresh")
        fresh = [p for p in common.children(pid) if b"meta.projection.writer_process" in _cmdline(p)]
        assert len(fresh) == 1 and _gone(zygote), fresh
        assert common.process_name(fresh[0]) == writer_zygote.WRITER_NAME and scale._snapshot_writers(pid) == []
        c.kill9(node)

        async def writer_gone():
            return _gone(fresh[0]) and _gone(zygote)
        await wait_until(writer_gone, WAIT_S, "the writer to end with its node")


async def test_a_writer_that_cannot_open_is_opened_again_until_it_does(tmp_path):
    # Its database's directory appears only after the node started: every open fails until then (SQLite cannot
    # make the file), as a writer killed while it opens fails. The projection must not end there for the node's life.
    late = tmp_path / "late"
    async with cluster_mod.running(str(tmp_path), metas=1,
                                   meta={"projection_url": f"sqlite:///{late / 'projection.db'}"}) as c:
        async def open_failed():
            with open(os.path.join(c.dir, "logs", f"{c.info['meta'][0]['node']}.log")) as f:
                return "projection_open_failed" in f.read()
        await wait_until(open_failed, WAIT_S, "an open of the projection to fail, and be logged")
        late.mkdir()
        async with c.session.put(c.meta_urls[0] + "/v1/brokers/b1", json={"address": "http://127.0.0.1:1"},
                                 headers=c.headers("broker")) as r:
            assert r.status == 200, await r.text()

        async def projected():
            async with c.session.get(c.meta_urls[0] + "/readyz") as r:
                return (await r.json())["projection_position"] >= 1
        await wait_until(projected, WAIT_S, "the projection to open and take the registration")
