"""The raft tick on the node's event loop, with a thread that stands in while the loop is busy.

A node's tick ran on a thread of its own, and a write crossed threads four times: the loop queued the proposal and
woke the tick through a pipe, the tick replicated it, the apply thread applied it, and the loop was woken again to
answer. Each crossing is a wake-up and the GIL handed over between threads that all wanted it (strace of one
write on the leader: the three threads traded the GIL for most of its time), and under load the tick waited up to
a switch interval for the loop to let go. etcd runs its raft node in the goroutine that serves the proposal's
channel; the nearest thing here is the loop itself: a proposal asks for a tick with ``call_soon``, the tick runs
between two callbacks of the loop, and its answers are posted with ``call_soon`` (meta/raft/node.py LoopBridge).

How the loop learns there is raft work: every descriptor pysyncobj's poller watches (the pipe notifier, the
listening socket, each peer link) is watched by the loop too (``LoopPoller``): one ready to read, or to write while
the transport waits to, asks for a tick, and the tick's own ``poll(0)`` handles it as the thread's did. A timer
asks for one every ``period_s`` (heartbeats, elections, timeouts).

What the loop cannot promise is time: a callback that holds it (a large body parsed, a route encoded) holds the
tick, and a leader whose tick waits an election timeout loses its place. So a watchdog thread looks every
``WATCHDOG_PERIOD_S``, and when no tick ran for ``STALL_S`` it runs one itself. A lock makes the two take turns
(never two ticks at once); a tick the loop asked for while the thread held it runs after it.
"""

from __future__ import annotations

import asyncio
import select
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
from pysyncobj.poller import POLL_EVENT_TYPE, Poller

log = structlog.get_logger("meta.raft")

WATCHDOG_PERIOD_S = 0.025
STALL_S = 0.075        # a heartbeat period and a half: well inside the shortest election timeout (0.25 s)
DETACH_WAIT_S = 5.0    # a stop from another thread waits this long for the loop to let go of the descriptors
STOP_WAIT_S = 5.0      # and this long for a tick in progress


class LoopPoller(Poller):
    """pysyncobj's poll poller (its ``PollPoller``, written out: the event loop watches what it subscribes once
    ``attach``ed, and ``poll`` says whether anything was ready)."""

    def __init__(self) -> None:
        self._poll = select.poll()
        self._callbacks: dict[int, Callable[[int, int], None]] = {}
        self._masks: dict[int, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._ready: Callable[[], None] | None = None
        self.last_poll_handled = False   # the last poll found something ready (see LoopTicker._run)

    def subscribe(self, descr: Any, callback: Callable[[int, int], None], eventMask: int) -> None:
        fd = _fd(descr)
        events = ((select.POLLIN if eventMask & POLL_EVENT_TYPE.READ else 0)
                  | (select.POLLOUT if eventMask & POLL_EVENT_TYPE.WRITE else 0)
                  | (select.POLLERR if eventMask & POLL_EVENT_TYPE.ERROR else 0))
        self._callbacks[fd] = callback
        self._poll.register(fd, events)
        self._masks[fd] = eventMask
        if self._loop is not None:
            self._watch(fd, eventMask)

    def unsubscribe(self, descr: Any) -> None:
        fd = _fd(descr)
        try:
            self._poll.unregister(fd)
        except KeyError:
            pass
        self._callbacks.pop(fd, None)
        if self._masks.pop(fd, None) is not None and self._loop is not None:
            self._watch(fd, 0)

    def poll(self, timeout: float) -> None:
        ready = self._poll.poll(timeout * 1000)
        self.last_poll_handled = bool(ready)
        for fd, event in ready:
            mask = ((POLL_EVENT_TYPE.READ if event & select.POLLIN else 0)
                    | (POLL_EVENT_TYPE.WRITE if event & select.POLLOUT else 0)
                    | (POLL_EVENT_TYPE.ERROR if event & (select.POLLERR | select.POLLHUP) else 0))
            callback = self._callbacks.get(fd)
            if callback is not None:   # unsubscribed by an earlier callback of this same poll
                callback(fd, mask)

    def attach(self, loop: asyncio.AbstractEventLoop, ready: Callable[[], None]) -> None:
        """On ``loop``'s thread: from now on ``ready()`` is called there whenever a watched descriptor is ready."""
        self._loop, self._loop_thread, self._ready = loop, threading.get_ident(), ready
        for fd, mask in self._masks.items():
            self._watch(fd, mask)

    def detach(self) -> None:
        """On the loop's thread: the loop watches nothing of pysyncobj's any more."""
        if self._loop is not None:
            for fd in self._masks:
                self._watch(fd, 0)
            self._loop = self._ready = None

    def _watch(self, fd: int, mask: int) -> None:
        # Only the loop's own thread may change what it watches; subscriptions change inside a tick, which runs on
        # the loop, or on the watchdog thread while the loop is busy: the change then waits for the loop.
        loop, ready = self._loop, self._ready
        assert loop is not None and ready is not None
        if threading.get_ident() != self._loop_thread:
            loop.call_soon_threadsafe(self._watch_current, fd)
            return
        try:
            if mask & (POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR):
                loop.add_reader(fd, ready)
            else:
                loop.remove_reader(fd)
            if mask & POLL_EVENT_TYPE.WRITE:
                loop.add_writer(fd, ready)
            else:
                loop.remove_writer(fd)
        except (OSError, ValueError, RuntimeError):
            # The descriptor was closed before its unsubscribe reached the loop (a link the transport dropped):
            # nothing is left to watch. A live one whose watch failed is still read by every tick's poll(0).
            pass

    def _watch_current(self, fd: int) -> None:
        if self._loop is not None:
            self._watch(fd, self._masks.get(fd, 0))


class LoopTicker:
    """Runs ``tick()`` (one ``doTick(0)``) on the loop when asked, on a timer, and on a watchdog thread while the
    loop is held elsewhere; ``stop`` from any thread."""

    def __init__(self, tick: Callable[[], bool], poller: LoopPoller, period_s: float,
                 follow_up: Callable[[], bool] = lambda: True):
        """``follow_up()``: whether a tick whose last poll handled something needs another tick at once (see _run)."""
        self._tick = tick
        self._follow_up = follow_up
        self._poller = poller
        self._period_s = period_s
        self._lock = threading.Lock()           # whoever ticks holds it: never two ticks at once
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._scheduled = False                 # a tick is queued on the loop
        self._again = False                     # asked for while the watchdog ticked: the loop runs one after it
        self._stopping = threading.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._deferred: asyncio.TimerHandle | None = None   # wake_after's tick
        self._watchdog: threading.Thread | None = None
        self.last_tick = time.monotonic()       # when the last tick ended
        self._failed_until = 0.0                # a tick raised: asked-for ticks wait until then (timer, watchdog run)
        self.watchdog_ticks = 0                 # ticks the watchdog ran because the loop was held

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``'s thread."""
        self._loop, self._loop_thread = loop, threading.get_ident()
        self._poller.attach(loop, self.soon)
        self._timer = loop.call_later(self._period_s, self._on_timer)
        self._watchdog = threading.Thread(target=self._watch, name="raft-tick-watchdog", daemon=True)
        self._watchdog.start()
        self.soon()

    def on_loop_thread(self) -> bool:
        return self._loop_thread == threading.get_ident()

    def between_ticks(self, work: Callable[[], bool]) -> bool:
        """On the loop's thread: ``work()`` now, holding the tick's lock as a tick would (pysyncobj's state is the
        tick's alone), and its answer; False, with nothing run, while the watchdog ticks or once stopping."""
        if self._stopping.is_set() or not self._lock.acquire(blocking=False):
            return False
        try:
            return work()
        finally:
            self._lock.release()

    def soon(self) -> None:
        """On the loop's thread: a tick as soon as the loop gets to it (one, however many ask before)."""
        if not self._scheduled and not self._stopping.is_set() and time.monotonic() >= self._failed_until:
            self._scheduled = True
            self._loop.call_soon(self._run_on_loop)

    def wake_after(self, delay_s: float) -> None:
        """On the loop's thread: a tick once ``delay_s`` has passed (one, however many ask before it runs); a tick
        that runs meanwhile for another reason does not cancel it (it finds nothing, or what came since)."""
        if self._deferred is None and not self._stopping.is_set():
            self._deferred = self._loop.call_later(delay_s, self._deferred_wake)

    def _deferred_wake(self) -> None:
        self._deferred = None
        self.soon()

    def _run_on_loop(self) -> None:
        self._scheduled = False
        # Said before trying: the watchdog reads it right after it lets go of the lock, and a request made between
        # a failed try and the flag would be lost until the timer.
        self._again = True
        if not self._lock.acquire(blocking=False):
            return   # the watchdog is ticking: it asks the loop for one more once it is done
        self._again = False
        try:
            self._run()
        finally:
            self._lock.release()
        if self._again:
            self._again = False
            self.soon()

    def _on_timer(self) -> None:
        if self._stopping.is_set():
            return
        self._timer = self._loop.call_later(self._period_s, self._on_timer)
        self._failed_until = 0.0
        self.soon()

    def _watch(self) -> None:
        while not self._stopping.wait(WATCHDOG_PERIOD_S):
            if time.monotonic() - self.last_tick < STALL_S or not self._lock.acquire(blocking=False):
                continue
            try:
                if self._stopping.is_set():
                    return
                self.watchdog_ticks += 1
                self._run()
            finally:
                self._lock.release()
            if self._again:
                self._again = False
                try:
                    self._loop.call_soon_threadsafe(self.soon)
                except RuntimeError:   # the loop is closed: the node is stopping
                    return

    def _run(self) -> None:   # holding self._lock
        if self._stopping.is_set():
            return
        try:
            if not self._tick():
                # A tick that raised may raise again at once (a descriptor still ready): the next one waits for
                # the timer, as the tick thread slept a period after a failure.
                self._failed_until = time.monotonic() + self._period_s
        finally:
            self.last_tick = time.monotonic()
        if self._poller.last_poll_handled and self._follow_up():
            # The tick ends in a poll, and what it read (a follower's acknowledgement) is acted on by the next
            # tick's start (the commit index moves there): the tick thread went straight on to it; so does this,
            # unless the node says it acted on it already (a follower: MetaSyncObj._follow_up_tick).
            self._again = True

    def stop(self) -> None:
        """Any thread: no tick after this returns, and the loop watches none of pysyncobj's descriptors (so they
        may be closed)."""
        self._stopping.set()
        if not self._lock.acquire(timeout=STOP_WAIT_S):   # a tick in progress ends first
            log.warning("raft_tick_still_running_at_stop")
        else:
            self._lock.release()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join(STOP_WAIT_S)
        if self._loop is None:
            return
        if self.on_loop_thread():
            self._detach()
            return
        detached = threading.Event()

        def detach() -> None:
            self._detach()
            detached.set()
        try:
            self._loop.call_soon_threadsafe(detach)
        except RuntimeError:   # the loop is closed: it watches nothing any more
            return
        if not detached.wait(DETACH_WAIT_S):
            log.warning("raft_loop_detach_timed_out")

    def _detach(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._deferred is not None:
            self._deferred.cancel()
        self._poller.detach()


def _fd(descr: Any) -> int:
    return descr if isinstance(descr, int) else descr.fileno()

