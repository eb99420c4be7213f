"""A meta cluster of one voter commits each write on its own sync, not at its next timed tick, and still packs a load's
writes into shared syncs.

pysyncobj moves a leader's commit index only at the start of a tick. With followers, their acknowledgements ask for
that tick; a lone voter has none, so each of its writes waited for the tick's timer: one writer made 20 writes a
second (50 ms each), and 8 to 16 writers had a p99 of 53 ms (meta/raft/local_commit.py ``commit_alone``).
"""

from __future__ import annotations

import asyncio
import statistics
import time

from meta.raft.node import TICK_PERIOD_S
from tests.support import cluster as cluster_mod
from tests.support.metrics import scrape, value

SEQUENTIAL = 40
# A write that waits for the timer is answered right after a tick, so the next one waits about a whole period.
# Committed on its own sync a write takes a few milliseconds: its median stays far below this on a loaded machine.
MEDIAN_S_MAX = TICK_PERIOD_S / 2
CONCURRENT = 256   # writes sent at once (the client's pool lets 100 at a time reach the node)


async def _write(c, m: str, value_: str) -> int:
    s, b, _ = await c.call("PUT", m + "/v1/topics/t/config", json={"k": value_})
    assert s == 200, b
    return b["version"]


async def test_a_lone_voters_writes_commit_on_its_sync_and_share_syncs_under_load(tmp_path):
    async with cluster_mod.one_meta_node(str(tmp_path)) as (c, m, _):
        s, b, _ = await c.call("POST", m + "/v1/topics", json={"topic": "t", "queues": 2})
        assert s == 201, b

        # One writer: each write answered at once, in order, and the last one is what the topic holds.
        versions, took = [], []
        for i in range(SEQUENTIAL):
            started = time.monotonic()
            versions.append(await _write(c, m, f"v{i}"))
            took.append(time.monotonic() - started)
        median = statistics.median(took)
        assert median < MEDIAN_S_MAX, f"a lone writer's median write took {median * 1000:.1f} ms: it waited for a tick"
        assert versions == sorted(set(versions)), versions
        s, b, _ = await c.call("GET", m + "/v1/topics/t")
        assert s == 200 and b["config"] == {"k": f"v{SEQUENTIAL - 1}"}, b

        # Many writers: every write answered, and they share syncs (one sync each is what sending every proposal
        # on at once, as a leader with nothing in flight does, would cost a lone voter, which never has anything
        # in flight for long).
        syncs_before = value(await scrape(c.session, m), "stator_meta_journal_syncs_total")
        answered = await asyncio.gather(*(_write(c, m, f"w{i}") for i in range(CONCURRENT)))
        syncs = value(await scrape(c.session, m), "stator_meta_journal_syncs_total") - syncs_before
        assert len(set(answered)) == CONCURRENT
        assert syncs <= CONCURRENT / 2, f"{syncs:.0f} journal syncs for {CONCURRENT} concurrent writes"
