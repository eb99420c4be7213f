"""The stamps of ops/bench/write_path.py: which calls of a meta node are stamped, how, and how the stamps of a run
become one write's path.

A node started with STATOR_WRITE_PATH_DIR set and ``write_path_probes/`` on its PYTHONPATH (its sitecustomize.py)
calls ``install``: each function of PROBES is wrapped so that a call appends (``<probe>0``, time) on entry and
(``<probe>1``, time) on exit to a deque in memory (one ``append`` of a tuple: about a microsecond a call), which
keeps the last STAMPS_MAX; SIGUSR1 writes them to ``<dir>/<pid>.stamps`` and empties it. Times are
``time.perf_counter_ns`` (CLOCK_MONOTONIC, one clock for every process of the machine), so the client's, the
leader's and the followers' stamps line up. Nothing in meta/ knows of this: the wrapping is done from outside, by
name, and ``missing_probes`` says which names no longer resolve (tests/test_bench_write_path.py fails then).
"""

from __future__ import annotations

import bisect
import collections
import functools
import importlib
import inspect
import os
import signal
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

DIR_ENV = "STATOR_WRITE_PATH_DIR"
# ~80 stamps a write at ~450 writes/s: the last ~50 s of a lone writer, ~150 MB. A longer run loses its oldest
# (the warm-up's first); the writes matched are the last ones.
STAMPS_MAX = 2_000_000
SUFFIX = ".stamps"

# (module, attribute path, probe name). Coroutine functions are stamped when they start and when they return.
PROBES: tuple[tuple[str, str, str], ...] = (
    ("aiohttp.web_protocol", "RequestHandler.data_received", "http_read"),
    ("aiohttp.web_protocol", "RequestHandler._handle_request", "handler"),
    ("meta.api.http", "body_of", "body"),
    ("meta.service", "MetaService.submit", "submit"),
    ("meta.raft.node", "MetaSyncObj.propose", "propose"),
    ("meta.raft.node", "MetaSyncObj._onTick", "tick"),
    ("meta.raft.journal", "StatorJournal.add", "journal_add"),
    ("meta.raft.journal", "StatorJournal.start_writeback", "writeback"),
    ("meta.raft.journal", "StatorJournal.sync", "sync"),
    ("meta.raft.transport", "StatorTransport.flush", "flush"),
    ("meta.raft.transport", "StatorTransport._write", "send"),
    ("meta.raft.transport", "StatorTransport._read", "read"),
    ("meta.state_machine", "StateMachine.apply", "state_machine"),
    ("meta.api.http", "respond", "respond"),
    ("aiohttp.http_writer", "StreamWriter._writelines", "answer_write"),
)


def _resolve(module: str, path: str) -> tuple[Any, str]:
    owner: Any = importlib.import_module(module)
    *parents, name = path.split(".")
    for part in parents:
        owner = getattr(owner, part)
    getattr(owner, name)   # AttributeError when the name is gone
    return owner, name


def missing_probes() -> list[str]:
    """The probes whose function no longer exists under its name (a rename in meta/ or aiohttp)."""
    missing = []
    for module, path, _ in PROBES:
        try:
            _resolve(module, path)
        except (ImportError, AttributeError):
            missing.append(f"{module}.{path}")
    return missing


def install(out_dir: str) -> None:
    """In a meta node, before its modules run: wrap every probe, and dump the stamps on SIGUSR1."""
    stamps: collections.deque[tuple[str, int]] = collections.deque(maxlen=STAMPS_MAX)
    clock = time.perf_counter_ns

    def stamped(fn: Any, probe: str) -> Any:
        enter, leave = probe + "0", probe + "1"
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def coroutine(*args: Any, **kwargs: Any) -> Any:
                stamps.append((enter, clock()))
                try:
                    return await fn(*args, **kwargs)
                finally:
                    stamps.append((leave, clock()))
            return coroutine

        @functools.wraps(fn)
        def plain(*args: Any, **kwargs: Any) -> Any:
            stamps.append((enter, clock()))
            try:
                return fn(*args, **kwargs)
            finally:
                stamps.append((leave, clock()))
        return plain

    # Modules that import a probed function by name (``from .http import body_of``) must see the wrapper: every
    # probe is wrapped before the node imports its API modules, which happens after sitecustomize.
    for module, path, probe in PROBES:
        owner, name = _resolve(module, path)
        setattr(owner, name, stamped(getattr(owner, name), probe))

    def dump(_signum: int, _frame: Any) -> None:
        taken = [stamps.popleft() for _ in range(len(stamps))]   # the apply thread may append meanwhile
        path = os.path.join(out_dir, f"{os.getpid()}{SUFFIX}")
        with open(path + ".tmp", "w") as f:
            f.writelines(f"{probe} {t}\n" for probe, t in taken)
        os.replace(path + ".tmp", path)
    signal.signal(signal.SIGUSR1, dump)


def read_stamps(path: str) -> dict[str, list[int]]:
    """One node's dump: probe event -> its times, sorted."""
    out: dict[str, list[int]] = {}
    with open(path) as f:
        for line in f:
            event, t = line.split()
            out.setdefault(event, []).append(int(t))
    for times in out.values():
        times.sort()
    return out


# -- one write's path ----------------------------------------------------------------------------------------------
# A lone writer's write that entered at the leader, in the order its steps happen. ``send1`` is the first follower's
# entries leaving (the transport's first write after the append); ``sync0``/``sync1`` the leader's own fdatasync,
# after the sends; ``propose1`` the return of propose, once the marks left too.
LEADER_TO_FOLLOWERS = ("http_read0", "http_read1", "handler0", "body0", "body1", "submit0", "propose0",
                       "journal_add0", "journal_add1", "writeback0", "writeback1", "flush0", "send0", "send1",
                       "flush1", "sync0", "sync1", "propose1")
FOLLOWER = ("read0", "journal_add0", "sync0", "sync1", "flush1")
LEADER_AFTER_ACK = ("read0", "read1", "state_machine0", "state_machine1", "tick1", "submit1", "respond0",
                    "respond1", "answer_write0", "answer_write1")


def _first_at_or_after(events: Mapping[str, list[int]], event: str, t: int, until: int) -> int | None:
    times = events.get(event, [])
    i = bisect.bisect_left(times, t)
    return times[i] if i < len(times) and times[i] <= until else None


def _last_at_or_before(events: Mapping[str, list[int]], event: str, t: int, since: int) -> int | None:
    times = events.get(event, [])
    i = bisect.bisect_right(times, t) - 1
    return times[i] if i >= 0 and times[i] >= since else None


def write_path(t0: int, t1: int, leader: Mapping[str, list[int]],
               followers: Sequence[Mapping[str, list[int]]]) -> dict[str, int] | None:
    """The steps of one write sent at ``t0`` and answered at ``t1`` (the client's clock): step -> time. Leader steps
    are ``leader.<event>``, then ``ack1.<event>`` / ``ack2.<event>`` for the follower that acknowledged first and
    second, then ``answer.<event>`` for the leader from the first acknowledgement's arrival. None when a step of the
    leader's way out is missing (a write that waited behind a tick, say)."""
    path: dict[str, int] = {}
    t = t0
    for event in LEADER_TO_FOLLOWERS:
        found = _first_at_or_after(leader, event, t, t1)
        if found is None:
            return None
        path[f"leader.{event}"] = t = found
    sent = path["leader.send0"]
    acks = []
    for follower in followers:
        sync0 = _first_at_or_after(follower, "sync0", sent, t1)
        sync1 = _first_at_or_after(follower, "sync1", sync0, t1) if sync0 is not None else None
        acked = _first_at_or_after(follower, "flush1", sync1, t1) if sync1 is not None else None
        if acked is None:
            continue
        steps = {"read0": _last_at_or_before(follower, "read0", sync0, sent),
                 "journal_add0": _last_at_or_before(follower, "journal_add0", sync0, sent),
                 "sync0": sync0, "sync1": sync1, "flush1": acked}
        acks.append({k: v for k, v in steps.items() if v is not None})
    if not acks:
        return None
    acks.sort(key=lambda steps: steps["flush1"])
    for n, steps in enumerate(acks[:2], 1):
        path.update({f"ack{n}.{event}": t for event, t in steps.items()})
    t = acks[0]["flush1"]
    for event in LEADER_AFTER_ACK:
        found = _first_at_or_after(leader, event, t, t1)
        if found is not None:
            path[f"answer.{event}"] = t = found
    path["client.answered"] = t1
    return path


def step_medians(writes: Iterable[tuple[int, int]], leader: Mapping[str, list[int]],
                 followers: Sequence[Mapping[str, list[int]]]) -> tuple[list[dict[str, Any]], int]:
    """Per step, over the writes whose path was found: the median time from the client's send (µs), in the order
    of those medians, each with the median's growth over the step before; and how many writes had a path."""
    at: dict[str, list[float]] = {}
    found = 0
    for t0, t1 in writes:
        path = write_path(t0, t1, leader, followers)
        if path is None:
            continue
        found += 1
        for step, t in path.items():
            at.setdefault(step, []).append((t - t0) / 1000)
    rows, before = [], 0.0
    for step, median in sorted(((s, statistics.median(v)) for s, v in at.items()), key=lambda x: x[1]):
        rows.append({"step": step, "us_from_send": round(median, 1), "us_after_previous": round(median - before, 1),
                     "writes": len(at[step])})
        before = median
    return rows, found
