"""The chaos runner's cuttable TCP proxy (ops/chaos/proxy.py) on real loopback sockets: it forwards, a cut resets
open connections and black-holes new ones, a heal forwards again."""

from __future__ import annotations

import asyncio

from ops.chaos.proxy import Link
from ops.chaos.topology import free_span

WAIT_S = 5.0


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def _roundtrip(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.readexactly(len(payload)), WAIT_S)
    finally:
        writer.close()


def test_link_forwards_cuts_and_heals():
    async def scenario() -> None:
        base = free_span()
        server = await asyncio.start_server(_echo, "127.0.0.1", base + 1)
        link = Link("test", base, base + 1)
        await link.start()
        try:
            assert await _roundtrip(base, b"hello") == b"hello"
            reader, writer = await asyncio.open_connection("127.0.0.1", base)
            writer.write(b"x")
            assert await asyncio.wait_for(reader.readexactly(1), WAIT_S) == b"x"
            link.set_cut(True)
            # the open connection is reset ...
            assert await asyncio.wait_for(reader.read(10), WAIT_S) == b""
            writer.close()
            # ... and a new one is accepted but nothing comes back: a black hole, not a refusal
            r2, w2 = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", base), WAIT_S)
            w2.write(b"lost")
            await w2.drain()
            held = asyncio.ensure_future(r2.read(10))
            done, _ = await asyncio.wait([held], timeout=0.5)
            assert not done
            link.set_cut(False)
            assert await asyncio.wait_for(held, WAIT_S) == b""   # healing drops the held connection
            w2.close()
            assert await _roundtrip(base, b"again") == b"again"
        finally:
            await link.stop()
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())


def test_plan_lets_each_pair_dial_through_its_own_proxy(tmp_path):
    """The rule topology.py relies on: pysyncobj's higher address dials the lower and names itself; so each node must
    see a lower partner at that pair's proxy (sorting below its own address) and a higher one at its real address."""
    from meta.config import load as load_meta
    from broker.config import load as load_broker
    from ops.chaos import topology

    t = topology.plan(str(tmp_path), topology.free_span())
    cfgs = {n: load_meta(str(tmp_path / n / "config.json")) for n in t.meta_names}
    own = {n: c.raft for n, c in cfgs.items()}
    for n, c in cfgs.items():
        for m in c.members:
            if m.node == n:
                continue
            if own[m.node] < own[n]:           # n dials m: through the proxy of the pair, which leads to m
                link = t.links[f"raft:{n}->{m.node}"]
                assert m.raft == link.address and m.raft < own[n]
                assert f"127.0.0.1:{link.target_port}" == own[m.node]
                assert link.name in t.meta_pair_links[frozenset((n, m.node))]
            else:                              # m dials n and names itself by its real address
                assert m.raft == own[m.node] and own[n] < m.raft
            assert m.url == t.links[f"http:{n}->{m.node}"].url
    for i, b in enumerate(t.broker_names):
        cfg = load_broker(str(tmp_path / b / "config.json"))
        assert list(cfg.meta_urls) == [t.links[name].url for name in t.broker_meta_links[b]]
        assert cfg.url == t.links[f"front:{b}"].url and cfg.http_port == t.links[f"front:{b}"].target_port
