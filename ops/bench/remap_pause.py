"""How long a queue refuses writes during a graceful remap (seal-then-switch), and that offsets stay continuous.

    python -m ops.bench.remap_pause [--rounds 20]

Starts 3 meta nodes and 2 brokers; one producer sends small batches to queue 0 as fast as it can, following the route
(polling it) and re-resolving on NOT_LEADER / SEALING; the queue is remapped back and forth. The pause of a round is the
gap between the last acknowledged send on the old broker and the first one on the new broker: the refusal window (old
broker sealing -> seal report -> new start decided -> route pushed -> producer resolves the new broker -> the new broker
creates the queue and stores the first batch). Every other gap of the round is between two sends to the same broker;
the longest of those is reported apart as the round's stall (an fsync or the CPU held up by other work on the machine):
counting it as the pause made one slow fsync of an ordinary send look like a slow remap. A round whose queue has not
moved by the next remap counts the whole interval as its pause. Prints one JSON object.

``--producer client``: the producer is client/producer.py's, as users run it (route by subscription, idempotent
batches, X-Route-Version), not the bench's bare loop; ``refusals`` then counts its sends that took more than one
attempt. Its pauses include what the bare loop never meets: a new head holds idempotent sends until it has taken the
previous segment's producers' batches (broker/replication/producer_handover.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time

import aiohttp

from client.producer import Producer
from ops import devcluster
from ops.bench.common import free_base_port

Ack = tuple[float, list[int], str]  # monotonic time of the answer, logic offsets stored, broker address


def round_pauses(acks: list[Ack], marks: list[float], end: float) -> list[tuple[float, float]]:
    """(pause_ms, stall_ms) of each round: the gap across the switch to the new broker, and the longest other gap.

    A round runs from its remap request (``marks[i]``) to the next one (or ``end``); the ack before it is included, so
    a refusal window that began at once is measured from the last ack on the old broker.
    """
    out = []
    for i, t in enumerate(marks):
        stop = marks[i + 1] if i + 1 < len(marks) else end
        before = [a for a in acks if a[0] < t][-1:]
        window = before + [a for a in acks if t <= a[0] < stop]
        if not window:
            out.append(((stop - t) * 1000, 0.0))
            continue
        old = window[0][2]
        switch = next((k for k in range(1, len(window)) if window[k][2] != old), None)
        gaps = [(window[k][0] - window[k - 1][0]) * 1000 for k in range(1, len(window))]
        if switch is None:  # the queue never moved within the round
            out.append(((stop - window[0][0]) * 1000, max(gaps, default=0.0)))
            continue
        pause = gaps.pop(switch - 1)
        out.append((pause, max(gaps, default=0.0)))
    return out


def percentiles(values: list[float]) -> dict[str, float | None]:
    v = sorted(values)
    pick = lambda p: round(v[min(len(v) - 1, int(p * len(v)))], 1) if v else None  # noqa: E731
    return {"p50": pick(0.5), "p99": pick(0.99), "max": round(v[-1], 1) if v else None}


async def run(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="stator-bench-") as tmp:
        cluster = devcluster.up(os.path.join(tmp, "c"), 3, 2, free_base_port())
        try:
            meta = cluster["meta"][0]["url"]
            admin = {"Authorization": f"Bearer {cluster['admin_token']}"}
            client = {"Authorization": f"Bearer {cluster['client_token']}"}
            async with aiohttp.ClientSession() as s:
                async with s.post(f"{meta}/v1/topics", json={"topic": "pause", "queues": 1, "brokers": ["b1"]},
                                  headers=admin) as r:
                    assert r.status == 201, await r.text()
                state = {"addr": None, "stop": False}
                acks: list[Ack] = []
                errors: dict[str, int] = {}

                async def resolve():
                    while True:
                        async with s.get(f"{meta}/v1/routes/pause", headers=client) as r:
                            q = (await r.json())["queues"][0]
                        if q["writable"]:
                            state["addr"] = q["address"]
                            return
                        await asyncio.sleep(0.002)

                async def client_producer():
                    p = Producer([m["url"] for m in cluster["meta"]], cluster["client_token"], "pause",
                                 fault_avoidance=False)
                    try:
                        while not state["stop"]:
                            sent = await p.send_batch([b"p"] * 10, queue=0)
                            acks.append((time.monotonic(), sent.offsets, sent.broker))
                            if sent.attempts > 1:
                                errors["retried"] = errors.get("retried", 0) + 1
                    finally:
                        await p.close()

                async def producer():
                    await resolve()
                    payload = {"messages": [{"body": "p"}] * 10}
                    while not state["stop"]:
                        async with s.post(f"{state['addr']}/v1/messages/pause/0", json=payload, headers=client) as r:
                            body = await r.json()
                        if r.status == 200:
                            acks.append((time.monotonic(), body["offsets"], state["addr"]))
                        else:
                            code = body["error"]["code"]
                            errors[code] = errors.get(code, 0) + 1
                            await resolve()

                task = asyncio.create_task(client_producer() if args.producer == "client" else producer())
                await asyncio.sleep(1.0)
                marks: list[float] = []
                for i in range(args.rounds):
                    target = "b2" if i % 2 == 0 else "b1"
                    t = time.monotonic()
                    async with s.post(f"{meta}/v1/topics/pause/remap", json={"brokers": [target]}, headers=admin) as r:
                        assert r.status == 200, await r.text()
                    marks.append(t)
                    await asyncio.sleep(args.interval)
                state["stop"] = True
                await task
                end = time.monotonic()
            rounds = round_pauses(acks, marks, end)
            offsets = [o for _, offs, _ in acks for o in offs]
            continuous = offsets == list(range(len(offsets)))
            return {"benchmark": "remap_pause", "rounds": args.rounds,
                    "pause_ms": percentiles([p for p, _ in rounds]),
                    "stall_ms": percentiles([s for _, s in rounds]),
                    "acknowledged_messages": len(offsets), "offsets_continuous": continuous,
                    "refusals": errors, "loadavg": open("/proc/loadavg").read().split()[:3]}
        finally:
            devcluster.down(os.path.join(tmp, "c"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between remaps")
    ap.add_argument("--producer", choices=("raw", "client"), default="raw",
                    help="the bench's bare send loop, or client/producer.py's Producer")
    args = ap.parse_args()
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
