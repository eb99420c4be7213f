"""The chaos cluster's layout: 3 meta nodes and 3 brokers in their own directory, every link between them through a
proxy (proxy.Link) the nemesis can cut.

How nodes are made to talk through proxies while each binds its own port:
- Raft (pysyncobj): between two nodes there is one TCP connection, opened by the node whose own address sorts higher,
  which then sends that address as its name; the other side looks the name up in its partner list. So each node's
  config lists a *lower* partner at a proxy address made for that pair (the dialer only connects there), and a
  *higher* partner at its real address (only used to recognise the name it sends). Every proxy port sorts below every
  real raft port, so both sides still agree on who dials. Cutting the pair's proxy cuts that pair both ways.
- Meta HTTP between nodes (followers forward writes to the leader): each node's config gives every other member's
  ``url`` as a proxy made for that ordered pair.
- Broker to meta: each broker's ``meta`` list is its own proxy per meta node.
- Every member runs with the power-loss ledger (runtime/power_loss.py, SERVE_FLAGS), so the nemesis's ``power`` fault
  can make a kill -9 lose what a power loss would.
- Clients and brokers reach a broker at its ``advertise`` URL, a proxy in front of its port (``front:bN``). Every
  other broker's replica fetches from it go through that proxy (broker/replication/follower.py fetches at the
  route's address of the leader), so cutting it cuts the broker off from its followers; a broker's own fetches from
  other leaders go through *their* fronts and stay up. A broker has one advertise address for clients and peers
  alike, so the cut also stops every client that goes through the front: the send workload therefore sends to each
  broker's own port (``direct_urls``), and keeps reaching a broker cut off from its peers and from meta (the
  nemesis's ``broker_partition``): a leader that still takes sends while no follower can copy them.
The runner's own clients talk to meta nodes directly: a partition is between the cluster's parts, not from the client.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from typing import Any

from runtime.credentials import token_hash
from ops import devcluster
from runtime import power_loss

from .proxy import Link

METAS = 3
BROKERS = 3
PORT_SPAN = 100
PORT_LOW, PORT_HIGH = 20000, 32000     # five digits each: raft addresses compare as strings, so digits must match
# A pid that can never exist (Linux pid_max is at most 2**22): devcluster.restart_all then starts every member.
NEVER_STARTED_PID = 2**22 + 1
# Every meta node compacts its log every few seconds under the workloads (the defaults, 20,000 entries or 300 s,
# would never compact in a run): a member that was away for a fault comes back behind its leader's first entry as
# often as not, and must be sent a snapshot (nemesis.py ``install`` makes sure of it). Each node compacts in a slot
# of its own once per COMPACTION_MIN_TIME_S (pysyncobj's logCompactionSplit), when it holds more than
# COMPACTION_MIN_ENTRIES entries or its last compaction is older than that period: the slots are a period apart, so
# in practice the entries decide, and with 50 (fewer than a faulted cluster appends in 3 s) a node compacted only
# every other period.
COMPACTION_MIN_TIME_S = 3
COMPACTION_MIN_ENTRIES = 20
# Every member's serve command: the ledger is always on in chaos runs (the power fault needs it on every member).
SERVE_FLAGS = [power_loss.FLAG]
# Segments roll every few dozen small batches, and a big message takes a segment of its own: the workloads' sends
# cross segment boundaries (rolls, sealed indexes, a new file's creation) many times per run. The broker's minimum
# is broker/storage/limits.py SEGMENT_BYTES_LIMIT_MIN (1 KiB).
BROKER_SEGMENT_BYTES = 16 * 1024
BROKER_EXTRA = {"segment_bytes_max": BROKER_SEGMENT_BYTES}
# Short enough that a killed or partitioned broker is fenced (and its queues move) within a fault's hold time.
META_EXTRA = {"session_timeout_ms": 4000, "heartbeat_interval_ms": 1000,
              "raft_tuning": {"compaction_min_entries": COMPACTION_MIN_ENTRIES,
                              "compaction_min_time_s": COMPACTION_MIN_TIME_S}}


@dataclass
class Topology:
    dir: str
    base: int
    links: dict[str, Link] = field(default_factory=dict)
    # names of the links cut to separate each pair of meta nodes, and each broker from each meta node
    meta_pair_links: dict[frozenset[str], list[str]] = field(default_factory=dict)
    broker_meta_links: dict[str, list[str]] = field(default_factory=dict)
    # the proxy in front of each broker's port: its advertise address, for clients and its followers alike
    broker_front_links: dict[str, str] = field(default_factory=dict)

    @property
    def meta_names(self) -> list[str]:
        return [f"m{i + 1}" for i in range(METAS)]

    @property
    def broker_names(self) -> list[str]:
        return [f"b{i + 1}" for i in range(BROKERS)]

    def meta_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.base + 10 + i}"

    def broker_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.base + 60 + i}"

    def raft_port(self, i: int) -> int:
        return self.base + 20 + i

    def direct_urls(self) -> dict[str, str]:
        """Each broker's advertise URL (its front proxy) -> the URL of its own port, around the proxy."""
        return {self.links[self.broker_front_links[b]].url: self.broker_url(i) for i, b in enumerate(self.broker_names)}

    def cluster(self) -> dict[str, Any]:
        return devcluster.load(self.dir)


def free_span() -> int:
    """A base port whose whole span of PORT_SPAN ports is free (below the ephemeral range, as devcluster's)."""
    import random
    low, high = devcluster.port_range()
    low, high = max(low, PORT_LOW), min(high, PORT_HIGH)
    for _ in range(500):
        base = random.randrange(low, high - PORT_SPAN) // PORT_SPAN * PORT_SPAN
        if base >= low and all(devcluster.port_free(base + i) for i in range(PORT_SPAN)):
            return base
    raise RuntimeError("no free port range for the chaos cluster")



def plan(dir_: str, base: int) -> Topology:
    """Write every member's config and a stopped cluster.json into ``dir_``; return the links to start."""
    dir_ = os.path.abspath(dir_)
    os.makedirs(dir_, exist_ok=True)
    t = Topology(dir_, base)

    def add(name: str, listen: int, target: int) -> Link:
        return t.links.setdefault(name, Link(name, listen, target))

    tokens = {r: secrets.token_hex(16) for r in ("admin", "client")}
    broker_tokens = devcluster.issue_broker_tokens(list(t.broker_names))
    hashes = {b: token_hash(tok) for b, tok in broker_tokens.items()}
    secret = secrets.token_hex(24)
    cluster: dict[str, Any] = {"meta": [], "brokers": [], "admin_token": tokens["admin"],
                               "broker_token": broker_tokens["b1"], "client_token": tokens["client"],
                               "broker_tokens": broker_tokens}
    names = t.meta_names
    for i in range(METAS):
        members = []
        for j in range(METAS):
            if j == i:
                members.append({"node": names[i], "raft": f"127.0.0.1:{t.raft_port(i)}", "url": t.meta_url(i)})
                continue
            http = add(f"http:{names[i]}->{names[j]}", base + 30 + 3 * i + j, base + 10 + j)
            lo, hi = min(i, j), max(i, j)
            # proxy ports base+0..8 sort below every real raft port base+20..22
            raft = add(f"raft:{names[hi]}->{names[lo]}", base + 3 * hi + lo, t.raft_port(lo))
            raft_addr = raft.address if j < i else f"127.0.0.1:{t.raft_port(j)}"
            members.append({"node": names[j], "raft": raft_addr, "url": http.url})
            t.meta_pair_links.setdefault(frozenset((names[i], names[j])), [])
            for name in (http.name, raft.name):
                if name not in t.meta_pair_links[frozenset((names[i], names[j]))]:
                    t.meta_pair_links[frozenset((names[i], names[j]))].append(name)
        cfg = {"node": names[i], "data_dir": "data", "http": t.meta_url(i).removeprefix("http://"), "secret": secret,
               "tokens": tokens, "broker_tokens": hashes, "members": members, **META_EXTRA}
        path = devcluster.write_config(dir_, names[i], cfg)
        cluster["meta"].append({"node": names[i], "url": t.meta_url(i), "pid": NEVER_STARTED_PID, "config": path,
                                "serve_flags": SERVE_FLAGS})
    for b, bname in enumerate(t.broker_names):
        metas = [add(f"http:{bname}->{names[m]}", base + 40 + 3 * b + m, base + 10 + m) for m in range(METAS)]
        t.broker_meta_links[bname] = [link.name for link in metas]
        front = add(f"front:{bname}", base + 70 + b, base + 60 + b)
        t.broker_front_links[bname] = front.name
        cfg = {"broker": bname, "data_dir": "data", "http": t.broker_url(b).removeprefix("http://"),
               "advertise": front.url, "tokens": {**tokens, "broker": broker_tokens[bname]}, "broker_tokens": hashes,
               "meta": [link.url for link in metas]}
        cfg.update(BROKER_EXTRA)
        path = devcluster.write_config(dir_, bname, cfg)
        cluster["brokers"].append({"broker": bname, "url": t.broker_url(b), "pid": NEVER_STARTED_PID,
                                   "config": path, "serve_flags": SERVE_FLAGS})
    devcluster.save(dir_, cluster)
    return t
