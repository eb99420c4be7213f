"""A meta node left alone (both peers killed) is not ready, and its readiness probe's 503 is an answer, not a
refusal: the refusals counter (what operators alert on) must not grow while a node is not ready, yet must still
count the writes it refuses meanwhile. pysyncobj's follower campaigns only while connected to a peer, so a lone
one kept naming its dead leader and answered ready for as long as it stayed alone
(``pysyncobj_shim.leader_out_of_reach``)."""

from __future__ import annotations

import asyncio
import time

from tests.support import cluster as cluster_mod
from tests.support.metrics import scrape

NOT_READY_WAIT_S = 30.0   # the survivor's election timeout passes and it has no leader: generous for a loaded machine


def _refused(samples: dict, code: str) -> float:
    return sum(v for labels, v in samples.get("stator_meta_http_refusals_total", []) if labels.get("code") == code)


async def test_a_not_ready_meta_node_counts_no_refusal_for_its_probes(tmp_path):
    async with cluster_mod.running(str(tmp_path), 3, 0) as c:
        # A follower survives: a leader left alone keeps leading until its fallback timeout (30 s) runs out.
        leader = await c.leader(30.0)
        survivor = next(m for m in c.info["meta"] if m["node"] != leader)
        for m in c.info["meta"]:
            if m is not survivor:
                await asyncio.to_thread(c.kill9, m["node"])
        deadline = time.monotonic() + NOT_READY_WAIT_S
        while (await c.call("GET", survivor["url"] + "/readyz", role=""))[0] != 503:
            assert time.monotonic() < deadline, "the lone node stayed ready"
            await asyncio.sleep(0.2)
        before = await scrape(c.session, survivor["url"])
        for _ in range(5):
            assert (await c.call("GET", survivor["url"] + "/readyz", role=""))[0] == 503
        s, body, _ = await c.call("POST", survivor["url"] + "/v1/topics", json={"topic": "t", "queues": 1},
                                  timeout_s=30.0)
        assert s == 503, body
        after = await scrape(c.session, survivor["url"])
        assert _refused(after, "HTTP_503") == _refused(before, "HTTP_503"), "probes counted as refusals"
        code = body["error"]["code"]
        assert _refused(after, code) == _refused(before, code) + 1, f"the refused write ({code}) was not counted"
