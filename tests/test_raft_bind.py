"""The raft port listens on the address the node is given, not on every interface (issue 21): a node whose
raft address is 127.0.0.1:P takes connections there and refuses them on another local address (127.0.0.2)."""

from __future__ import annotations

import json
import socket

from tests.support import cluster as cluster_mod


def _connects(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5.0).close()
        return True
    except ConnectionRefusedError:
        return False


async def test_raft_listens_only_on_its_own_address(tmp_path):
    async with cluster_mod.running(str(tmp_path), 3, 0) as c:
        await c.leader(30.0)
        for m in c.info["meta"]:
            with open(m["config"]) as f:
                config = json.load(f)
            own = next(x for x in config["members"] if x["node"] == config["node"])
            host, port = own["raft"].rsplit(":", 1)
            assert host == "127.0.0.1"
            assert _connects(host, int(port)), m
            assert not _connects("127.0.0.2", int(port)), f"{m['node']}'s raft port answers on 127.0.0.2"
