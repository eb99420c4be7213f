"""Fill the page cache before a benchmark that writes much data, as a broker machine's is in steady state.

Why: on this VM (Firecracker, a virtio balloon with free page reporting) the guest hands the pages it frees back to
the host, and the host backs a page again only when the guest next touches it. Page cache growing into free memory
then costs a host fault per page: writing 4 GiB into a new file went at ~370 MB/s and 2.1 ms of system time per MB,
against 2-4 GB/s and 0.2 ms per MB over pages in use (``python -m ops.bench.page_cache`` shows both). A run that
writes 3 copies of each message pays that three times as often as one writing 1 copy, and the later passes of a run
more than the first: ``ops.bench.replication``'s replicas=3 / replicas=1 ratio wandered from 0.35 to 0.6 between
runs of the same code. A broker in production runs with its page cache full (Kafka and RocketMQ expect the OS to
use all free memory for it): a new page comes from reclaiming a clean old one, never from the host.

``filled`` writes one file of the available memory less ``headroom_mib`` (the cluster's own processes), syncs it so
that its pages are clean (reclaimed without I/O), keeps it for the benchmark and removes it afterwards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator

CHUNK_BYTES = 1 << 20
HEADROOM_MIB = 4096          # left free for the processes the benchmark starts
FILL_MAX_MIB = 64 * 1024
DISK_SPARE_MIB = 8 * 1024    # the benchmark's own data needs room on the same file system
FILL_TIMEOUT_S = 300.0       # a slower disk ends the fill early; the answer says how much was written


def available_mib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def fill_size_mib(directory: str, headroom_mib: int = HEADROOM_MIB) -> int:
    disk_free = shutil.disk_usage(directory).free // (1 << 20)
    return max(0, min(available_mib() - headroom_mib, disk_free - DISK_SPARE_MIB, FILL_MAX_MIB))


@contextlib.contextmanager
def filled(directory: str, headroom_mib: int = HEADROOM_MIB) -> Iterator[dict]:
    """The page cache full of one synced file in ``directory`` while the block runs. Yields what was written: mib,
    seconds, mb_per_s (a first run on this VM shows its cold memory there: a few hundred MB/s)."""
    want = fill_size_mib(directory, headroom_mib)
    path = os.path.join(directory, "page-cache-fill")
    chunk = os.urandom(CHUNK_BYTES)
    started = time.monotonic()
    written = 0   # bytes
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        try:
            while written < want << 20 and time.monotonic() - started < FILL_TIMEOUT_S:
                written += os.write(fd, chunk)
            os.fsync(fd)
        finally:
            os.close(fd)
        seconds = time.monotonic() - started
        yield {"mib": written >> 20, "seconds": round(seconds, 1),
               "mb_per_s": round(written / 1e6 / seconds) if seconds > 0 else None}
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def first_touch(directory: str, mib: int = 2048) -> dict:
    """Writes ``mib`` into a new file twice (removed in between) and reports both rates: the first into whatever
    memory the page cache grows into, the second into the pages the first freed."""
    out = {}
    path = os.path.join(directory, "page-cache-probe")
    chunk = os.urandom(CHUNK_BYTES)
    for name in ("first", "second"):
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        t0, s0 = time.monotonic(), os.times().system
        try:
            for _ in range(mib):
                os.write(fd, chunk)
        finally:
            os.close(fd)
            os.unlink(path)
        seconds, system = time.monotonic() - t0, os.times().system - s0
        out[name] = {"mb_per_s": round(mib * CHUNK_BYTES / 1e6 / seconds), "system_ms_per_mb": round(
            system * 1000 / (mib * CHUNK_BYTES / 1e6), 2)}
    return out


if __name__ == "__main__":
    import json
    import tempfile
    with tempfile.TemporaryDirectory(prefix="stator-page-cache-") as tmp:
        print(json.dumps({"available_mib": available_mib(), "probe": first_touch(tmp)}, indent=2))
