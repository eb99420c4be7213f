"""One real MetaSyncObj node in its own process, driven over a small HTTP face: for tests of the log itself.

    python -m tests.support.raft_proc ADDRESS PEERS DATA_DIR SECRET HTTP_PORT TUNING_JSON

The meta service's API cannot carry commands near the log's 8 MiB limit (request bodies stop at 1 MiB), so this
face builds them in the node: ``POST /propose?entry_bytes=N`` proposes a Barrier padded so that its log entry (the
type byte and the envelope as the leader stamps it) is exactly N bytes and answers the outcome or the error code;
``GET /status`` answers the node's role, commit and applied indexes and its image digest.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys

from aiohttp import web

from wire.errors import ApiError
from meta.raft.entry import encode_entry, encode_envelope, encode_stamp
from meta.raft.node import LoopBridge, MetaSyncObj, RaftNode, RaftTuning

PROPOSE_TIMEOUT_S = 5.0


def padded_barrier(raft: RaftNode, entry_bytes: int) -> dict:
    """A Barrier whose log entry, as the leader stamps it, is ``entry_bytes`` long when it is alone in its entry
    (ts has 13 digits until 2286; the sweep proposes one at a time)."""
    def length(pad: int) -> int:
        cmd = {"type": "Barrier", "pad": "x" * pad}
        envelope = encode_envelope(raft.envelope(cmd, None, "system"))
        return 1 + len(encode_entry(encode_stamp(raft.leader_fields()), [envelope]))
    return {"type": "Barrier", "pad": "x" * (entry_bytes - length(0))}


async def main(address: str, peers: str, data_dir: str, secret: str, http_port: int, tuning: str) -> None:
    loop = asyncio.get_running_loop()
    bridge = LoopBridge()
    bridge.loop = loop
    node = MetaSyncObj(address, [p for p in peers.split(",") if p], data_dir, secret,
                       RaftTuning(**json.loads(tuning)), lambda version, changed: None, bridge)
    node.start(loop)
    raft = RaftNode(node, loop, offset_budget=1000)

    async def propose(request: web.Request) -> web.Response:
        cmd = padded_barrier(raft, int(request.query["entry_bytes"]))
        try:
            outcome = await raft.propose(cmd, None, "system", timeout_s=PROPOSE_TIMEOUT_S)
        except ApiError as e:
            return web.json_response({"ok": False, "code": e.code, "details": e.details})
        return web.json_response({"ok": outcome["ok"], "code": None})

    async def status(_request: web.Request) -> web.Response:
        with node.image_lock:
            digest = hashlib.sha256(node.current_image().canonical_bytes()).hexdigest()
        return web.json_response({"leader": node.is_leader(), "commit": node.raftCommitIndex,
                                  "applied": node.applied_index, "digest": digest,
                                  "slow_ticks": node.slow_ticks, "role_changes": node.role_changes,
                                  **node.membership_status()})

    app = web.Application()
    app.router.add_post("/propose", propose)
    app.router.add_get("/status", status)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", http_port).start()
    try:
        await asyncio.Event().wait()   # until the test kills the process
    finally:
        node.stop()


if __name__ == "__main__":
    address, peers, data_dir, secret, http_port, tuning = sys.argv[1:7]
    asyncio.run(main(address, peers, data_dir, secret, int(http_port), tuning))
