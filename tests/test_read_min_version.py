"""Every meta read honours ``?min_version`` (API.md: the node waits, bounded by ``wait``, until it has applied V):
asked for a version no node has, each refuses with 503 VERSION_NOT_REACHED instead of answering from an older
state. The reads are the spec's: every GET it lists with ``min_version``, so a read added to the spec is checked
too. The watch stream ignored the parameter once, and a reader resuming on a node a version behind got a topic
older than the one it asked for.
"""

from __future__ import annotations

from meta.api.openapi import SPEC

FAR = 10**9
WAIT_S = 0.2
PATH_VALUES = {"topic": "t", "queue": "0", "group": "g", "broker": "b1"}
# The long poll takes min_version too; its ``wait`` is the poll's, so the version wait is the default (5 s).
LONG_POLL = "/v1/routes/{topic}"


def _reads() -> list[str]:
    return sorted(path for path, ops in SPEC["paths"].items()
                  if any(p.get("name") == "min_version" for p in ops.get("get", {}).get("parameters", [])))


async def test_every_read_refuses_a_version_this_node_has_not_applied(meta_cluster):
    c = meta_cluster
    reads = _reads()
    assert {"/v1/watch", "/v1/groups/{group}", "/v1/topics/{topic}", "/v1/history"} <= set(reads), reads
    asks = [(node, path, f"&wait={WAIT_S}") for node in c.meta_urls[:2] for path in reads]  # one is a follower
    asks.append((c.meta_urls[0], LONG_POLL, ""))
    for node, path, wait in asks:
        s, b, _ = await c.call("GET", f"{node}{path.format(**PATH_VALUES)}?min_version={FAR}{wait}")
        assert s == 503 and b["error"]["code"] == "VERSION_NOT_REACHED", (node, path, s, b)
