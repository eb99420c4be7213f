"""A sync of broker/storage/files held, counted or failed, the way a slow or failing disk would: the real function is
wrapped, never replaced, and runs once released."""

from __future__ import annotations

import asyncio
import errno
import threading

from broker.storage import files

WAIT_S = 10.0   # the longest a held sync waits for its release, and a test for a sync to start


class HeldSyncs:
    """Wraps ``files.<name>`` (``sync_data``: an fsync of one file; ``sync_filesystem``: a syncfs). Counts the calls
    (``calls``); while ``holding``, each waits for ``release``; then it runs, or fails with EIO (``fail``)."""

    def __init__(self, monkeypatch, name: str = "sync_data", fail: bool = False):
        self.calls = 0
        self.entered, self.release = threading.Event(), threading.Event()
        self.holding = True
        self.timed_out = False
        real = getattr(files, name)

        def held(fd: int) -> None:
            self.calls += 1
            self.entered.set()
            if self.holding:
                # No assert here: this runs on a syncer thread, where a failure would not reach the test (check()).
                self.timed_out |= not self.release.wait(WAIT_S)
            if fail:
                raise OSError(errno.EIO, "injected: the disk failed the write-back")
            real(fd)

        monkeypatch.setattr(files, name, held)

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, WAIT_S), "no sync started"

    def let_go(self) -> None:
        """Releases the held sync and holds none after it."""
        self.holding = False
        self.release.set()

    def check(self) -> None:
        assert not self.timed_out, "a sync waited for a release that never came"
