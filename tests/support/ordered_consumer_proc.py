"""An exclusive consumer in its own process, for tests that pause (SIGSTOP) or kill it.

    python -m tests.support.ordered_consumer_proc CLUSTER_JSON TOPIC GROUP MEMBER OUT_FILE

Each handled message is appended to OUT_FILE as one JSON line ``{"member","queue","offset","key","body","t"}`` and
flushed before the handler returns, so a test reads exactly what was handled even after a kill -9. SIGTERM closes the
consumer (commit, then leave); the exit code is 0 on a clean close, 1 if the consumer failed.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time

from client import ExclusiveConsumer


async def main(cluster_json: str, topic: str, group: str, member: str, out_path: str) -> int:
    with open(cluster_json) as f:
        info = json.load(f)
    out = open(out_path, "a", buffering=1)

    async def handle(m) -> None:
        out.write(json.dumps({"member": member, "queue": m.queue, "offset": m.offset, "key": m.key, "body": m.text,
                              "t": time.monotonic()}) + "\n")
        out.flush()

    consumer = ExclusiveConsumer([m["url"] for m in info["meta"]], info["client_token"], topic, group, handle,
                                 member=member, idle_pause_s=0.05)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(consumer.close()))
    try:
        await consumer.run()
    except Exception as e:  # noqa: BLE001 - reported to the test through the exit code and stderr
        print(f"consumer failed: {e!r}", file=sys.stderr)
        return 1
    finally:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(*sys.argv[1:6])))
