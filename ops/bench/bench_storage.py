"""Storage throughput: append 1 KB messages in batches with fsync per batch for a while, then read them all back.

    python -m ops.bench.bench_storage [--seconds 5] [--batch 100] [--message-bytes 1024] [--flush fsync|interval]

Prints one JSON object. The broker's target is 100,000 messages/s each way with HTTP on top, so storage alone must
be well above that. The read-back mostly hits the page cache, as a consumer close behind its producers does.
`disk_ceiling` is the same bytes written with bare pwrite + fdatasync per batch: what no storage code can beat
on this disk, so the gap to `write` is the cost of storage itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from broker.storage import FLUSH_FSYNC, FLUSH_INTERVAL, PhysicalQueue, QueueConfig
from broker.storage.files import sync_data
from broker.storage.limits import FRAME_HEADER_BYTES, RECORD_SIZE_BYTES

READ_BATCH_RECORDS = 1_000
READ_BATCH_BYTES = 4 * 1024 * 1024
# Keeps a fast disk from filling up during a long run.
WRITE_BYTES_MAX = 8 * 1024 * 1024 * 1024
DISK_CEILING_SECONDS = 1.0


def disk_ceiling(seconds: float, batch: int, message_bytes: int, directory: str) -> dict:
    """Bare appends of one batch's bytes with fdatasync after each, no framing, no Python beyond the loop."""
    path = os.path.join(directory, "ceiling.bin")
    buf = os.urandom(FRAME_HEADER_BYTES + batch * (message_bytes + RECORD_SIZE_BYTES))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        batches, pos = 0, 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            pos += os.pwrite(fd, buf, pos)
            sync_data(fd)
            batches += 1
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(path)
    return {"seconds": round(elapsed, 3), "batches_per_s": round(batches / elapsed),
            "messages_per_s": round(batches * batch / elapsed)}


def run(seconds: float, batch: int, message_bytes: int, flush: str, directory: str) -> dict:
    load_before = loadavg()
    config = QueueConfig(flush_policy=flush)
    queue = PhysicalQueue.create(os.path.join(directory, "bench.q0"), 0, config)
    payloads = [os.urandom(message_bytes) for _ in range(batch)]
    ts_ms = int(time.time() * 1000)

    written = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline and written * message_bytes < WRITE_BYTES_MAX:
        queue.append(payloads, ts_ms)
        written += batch
        if flush == FLUSH_INTERVAL:
            queue.maybe_flush(int(time.time() * 1000))
    queue.flush()
    write_s = time.perf_counter() - start

    read = 0
    offset = queue.min_offset
    start = time.perf_counter()
    while offset < queue.max_offset:
        records = queue.read(offset, READ_BATCH_RECORDS, READ_BATCH_BYTES)
        read += len(records)
        offset = records[-1].offset + 1
    read_s = time.perf_counter() - start
    segments = queue.segment_count
    queue.close()

    if read != written:
        raise AssertionError(f"wrote {written} messages but read back {read}")
    mb = message_bytes / 1e6
    return {
        "message_bytes": message_bytes,
        "batch_records": batch,
        "flush_policy": flush,
        "messages": written,
        "segments": segments,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "write": {"seconds": round(write_s, 3), "messages_per_s": round(written / write_s),
                  "mb_per_s": round(written * mb / write_s, 1),
                  "batches_per_s": round(written / batch / write_s)},
        "read": {"seconds": round(read_s, 3), "messages_per_s": round(read / read_s),
                 "mb_per_s": round(read * mb / read_s, 1)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--message-bytes", type=int, default=1024)
    parser.add_argument("--flush", choices=[FLUSH_FSYNC, FLUSH_INTERVAL], default=FLUSH_FSYNC)
    parser.add_argument("--dir", default=None, help="parent directory for the queue (default: a temporary one)")
    args = parser.parse_args(argv)
    directory = tempfile.mkdtemp(prefix="stator-bench-", dir=args.dir)
    try:
        result = run(args.seconds, args.batch, args.message_bytes, args.flush, directory)
        result["disk_ceiling"] = disk_ceiling(DISK_CEILING_SECONDS, args.batch, args.message_bytes, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


def loadavg() -> list[float] | None:
    """The machine's load next to every figure: a busy neighbour halves fsync throughput."""
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None


if __name__ == "__main__":
    sys.exit(main())
