"""Virtual time: an asyncio loop whose clock moves only when nothing is ready (``VirtualLoop``), per-node clocks on
top of it (``NodeClocks``), and the one table of module attributes the simulator swaps (``PATCHES``, ``patched``).

Every swap is a stopgap for a seam that production does not have yet (docs/testing.md, the simulator's seams); each names a
module attribute that must still exist (``tests/test_sim.py`` checks the table), so a rename in production fails a
test instead of silently leaving a real clock or a real socket under the simulator.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import importlib
import itertools
import os as _os
import time as _time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

from . import vnet

VIRTUAL_EPOCH_S = 1_800_000_000.0     # the wall clock every simulated node starts near (2027-01-15)
# Loop iterations at one virtual instant before the run is stopped as spinning: a task that never waits (a busy loop)
# would otherwise hold virtual time still for ever. The busiest instant of a schedule with brokers ran 126.
SPINS_MAX = 20_000


class SimulationDeadlock(RuntimeError):
    """Nothing is ready and nothing is scheduled: the awaited coroutine can never finish."""


class FakeSelector:
    """A selector with no file descriptors: ``select(timeout)`` moves the loop's clock forward instead of waiting."""

    def __init__(self) -> None:
        self.loop: VirtualLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> None:
        raise RuntimeError("the virtual loop has no file descriptors")

    def unregister(self, fileobj: Any) -> None:
        raise KeyError(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> None:
        raise KeyError(fileobj)

    def get_map(self) -> dict[Any, Any]:
        return {}

    def get_key(self, fileobj: Any) -> Any:
        raise KeyError(fileobj)

    def select(self, timeout: float | None = None) -> list[Any]:
        assert self.loop is not None
        if timeout is None:
            raise SimulationDeadlock("nothing is ready and nothing is scheduled")
        if timeout > 0:
            self.loop._now += timeout
            self.loop.spins = 0
        else:
            self.loop.spins += 1
            if self.loop.spins == SPINS_MAX:
                self.loop.on_spinning()
        return []

    def close(self) -> None:
        pass


class _OrderedTimer(asyncio.TimerHandle):
    """A timer that sorts by its time, then by when it was set: two timers due at one instant (two faults planned
    for one time, ``now + a constant`` from two callbacks) fire in the order they were set. asyncio's own timer
    sorts by time alone, so which of a tie fires first followed the heap's shape, which every earlier push and pop
    shapes: any harmless swap of two callbacks anywhere before changed a later outcome."""

    __slots__ = ("_seq",)

    def __init__(self, when: float, callback: Callable[..., Any], args: tuple[Any, ...], loop: VirtualLoop,
                 context: Any, seq: int):
        super().__init__(when, callback, args, loop, context)
        self._seq = seq

    def __lt__(self, other: Any) -> bool:
        return (self._when, self._seq) < (other._when, other._seq)

    def __le__(self, other: Any) -> bool:
        return (self._when, self._seq) <= (other._when, other._seq)

    def __gt__(self, other: Any) -> bool:
        return (self._when, self._seq) > (other._when, other._seq)

    def __ge__(self, other: Any) -> bool:
        return (self._when, self._seq) >= (other._when, other._seq)


class VirtualLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on virtual time, one thread, no I/O. Timers fire in the order of their time, ties in the
    order they were set (deterministic); executors run inline; ``call_soon_threadsafe`` needs no self-pipe (there
    is one thread)."""

    def __init__(self) -> None:
        self._now = 0.0
        self._timer_seq = itertools.count()
        self.net: vnet.VirtualNet | None = None
        self.spins = 0                     # loop iterations since virtual time last moved
        self._task_lives: dict[asyncio.Task, vnet.Life] = {}
        self.on_spinning: Callable[[], None] = self.stop
        selector = FakeSelector()
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        return self._now

    def _make_self_pipe(self) -> None:
        self._ssock = self._csock = None

    def _close_self_pipe(self) -> None:
        pass

    def _write_to_self(self) -> None:
        pass

    # -- the virtual net (ops/sim/vnet.py): aiohttp's connects and name lookups -----------------------------------
    async def create_connection(self, protocol_factory: Callable[[], asyncio.Protocol], host: str | None = None,
                                port: int | None = None, *, sock: Any = None, **_kw: Any) -> Any:
        if self.net is None:
            raise OSError("no virtual net on this loop: the simulator makes no real connection")
        if sock is not None:   # the address vnet.happy_eyeballs returned for aiohttp
            host, port = sock.host, sock.port
        assert host is not None and port is not None
        return await self.net.connect(vnet.HOST.get(), protocol_factory, host, int(port))

    async def getaddrinfo(self, host: Any, port: Any, *, family: int = 0, type: int = 0, proto: int = 0,
                          flags: int = 0) -> list[tuple[Any, ...]]:
        return vnet.address_info(host, int(port))

    # -- crashes of processes that run as tasks (the brokers): their callbacks end with them -----------------------
    def create_task(self, coro: Any, *, name: str | None = None, context: Any = None) -> asyncio.Task:
        task = super().create_task(coro, name=name, context=context)
        life = context.get(vnet.LIFE) if context is not None else vnet.LIFE.get()
        if life is not None:
            # Held until done: a crashed incarnation's task never is, and is kept rather than destroyed pending
            self._task_lives[task] = life
            task.add_done_callback(self._forget_task)
        return task

    def revive_all(self) -> None:
        """Every crashed incarnation's callbacks run again, the held ones first (only to cancel its tasks once a
        schedule is over)."""
        for life in dict.fromkeys(self._task_lives.values()):   # in order of their tasks: deterministic
            if not life.alive:
                life.alive = True
                held, life.held = life.held, []
                for callback, args in held:
                    self.call_soon(callback, *args)

    def _forget_task(self, task: asyncio.Task) -> None:
        self._task_lives.pop(task, None)

    def call_soon(self, callback: Callable[..., Any], *args: Any, context: Any = None) -> asyncio.Handle:
        return super().call_soon(_unless_dead(callback, context), *args, context=context)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any, context: Any = None
                ) -> asyncio.TimerHandle:
        # BaseEventLoop.call_at with _OrderedTimer (call_later comes here too)
        self._check_closed()
        timer = _OrderedTimer(when, _unless_dead(callback, context), args, self, context, next(self._timer_seq))
        heapq.heappush(self._scheduled, timer)
        timer._scheduled = True
        return timer

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> asyncio.Future:
        fut = self.create_future()
        try:
            fut.set_result(func(*args))
        except Exception as e:   # noqa: BLE001 - handed to the awaiting coroutine, as an executor would
            fut.set_exception(e)
        return fut


def _unless_dead(callback: Callable[..., Any], context: Any) -> Callable[..., Any]:
    """``callback``, or, when it belongs to an incarnation that may crash (vnet.LIFE), one that runs it only while
    that incarnation is alive."""
    life = (context.get(vnet.LIFE) if context is not None else vnet.LIFE.get())
    if life is None:
        return callback

    def if_alive(*args: Any) -> Any:
        if life.alive:
            return callback(*args)
        life.held.append((callback, args))
        return None

    return if_alive


class NodeClocks:
    """Each node's monotonic and wall clocks: the loop's time plus that node's offsets. ``current`` is the node whose
    code runs now (the scheduler sets it around each step); code outside any node step reads offset zero."""

    def __init__(self, loop: VirtualLoop):
        self.loop = loop
        self.current: str | None = None
        self.mono_offset: dict[str, float] = {}
        self.wall_offset: dict[str, float] = {}

    def monotonic(self) -> float:
        return self.loop._now + self.mono_offset.get(self.current or "", 0.0)

    def wall_s(self) -> float:
        return VIRTUAL_EPOCH_S + self.loop._now + self.wall_offset.get(self.current or "", 0.0)

    @contextlib.contextmanager
    def running(self, name: str) -> Iterator[None]:
        previous, self.current = self.current, name
        try:
            yield
        finally:
            self.current = previous


class NodeHalted(BaseException):
    """A node called ``os._exit`` (an apply that raised, an unreadable snapshot): the simulator records it as a
    violation instead of dying. A BaseException, so that no ``except Exception`` on the way swallows it."""

    def __init__(self, code: int):
        super().__init__(f"os._exit({code})")
        self.code = code


class _OsProxy:
    """``os`` for meta.raft.node: everything real but ``_exit``, which raises NodeHalted."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_os, name)

    @staticmethod
    def _exit(code: int) -> None:
        raise NodeHalted(code)


def _forbidden(*_args: Any, **_kw: Any) -> None:
    raise RuntimeError("a blocking sleep under the simulator")


class _Rng:
    """The stand-in for a module's ``random`` or ``os.urandom``: the current schedule's seeded generator."""

    def __init__(self, sim: Any):
        self._sim = sim

    def uniform(self, a: float, b: float) -> float:
        return self._sim.rng.uniform(a, b)

    def random(self) -> float:
        return self._sim.rng.random()

    def choice(self, seq: Any) -> Any:
        return seq[0]   # dns_resolver: one numeric address per host here


class _Counter:
    """``os``, ``secrets`` or ``uuid`` for draws that need only differ from one another (ids, nonces, temporary
    names, disk ids, a handle key), not be unpredictable: a counter, which takes nothing from the schedule's
    generator (one draw there shifts every schedule drawn after it)."""

    def __init__(self) -> None:
        self._drawn = 0

    def token_bytes(self, nbytes: int = 32) -> bytes:
        self._drawn += 1
        return self._drawn.to_bytes(nbytes, "big")

    urandom = token_bytes

    def token_hex(self, nbytes: int = 16) -> str:
        return self.token_bytes(nbytes).hex()

    def uuid4(self) -> Any:
        return SimpleNamespace(hex=self.token_hex(16))


BROKER_CLOCK_MODULES = (
    "broker.meta_link", "broker.node", "broker.offsets", "broker.peers", "broker.rates", "broker.reads",
    "broker.session", "broker.storage_threads", "broker.writes", "broker.pop.journal", "broker.pop.revive",
    "broker.pop.service", "broker.replication.leader", "broker.replication.offsets", "broker.replication.pop_copies",
    "broker.replication.producer_handover", "wire.waits", "ops.chaos.history", "ops.chaos.runner",
    "ops.chaos.workloads")


class _SimTime:
    """``time`` for a module the simulator runs in tasks: the loop's clocks (no node offset: tasks run outside
    the scheduler's node steps); perf_counter stays real (it only times work for metrics)."""

    def __init__(self, sim: Any):
        self._clocks = sim.clocks

    def monotonic(self) -> float:
        return self._clocks.monotonic()

    def time(self) -> float:
        return self._clocks.wall_s()

    def time_ns(self) -> int:
        return int(self._clocks.wall_s() * 1e9)

    @staticmethod
    def perf_counter() -> float:
        return _time.perf_counter()

    sleep = staticmethod(_forbidden)


def _seeded_backoff(sim: Any, module: str, name: str) -> Any:
    """A Backoff bound at import to ``random.random``, again with the schedule's generator."""
    import copy
    backoff = copy.copy(getattr(importlib.import_module(module), name))
    backoff._rng = sim.rng.random
    return backoff


# (module, attribute, factory(sim) -> replacement). The single list of stopgaps: each is a seam to land later
# (docs/testing.md, the simulator's seams), after which its row goes.
PATCHES: list[tuple[str, str, Callable[[Any], Any]]] = [
    # clocks
    ("pysyncobj.syncobj", "monotonicTime", lambda sim: sim.clocks.monotonic),
    ("pysyncobj.dns_resolver", "monotonicTime", lambda sim: sim.clocks.monotonic),
    ("meta.raft.pysyncobj_shim", "monotonic", lambda sim: sim.clocks.monotonic),
    ("meta.raft.roles", "time", lambda sim: SimpleNamespace(monotonic=sim.clocks.monotonic)),
    ("meta.raft.group_commit", "time", lambda sim: SimpleNamespace(monotonic=sim.clocks.monotonic)),
    ("meta.raft.transport", "time", lambda sim: SimpleNamespace(monotonic=sim.clocks.monotonic)),
    ("meta.raft.node", "time", lambda sim: SimpleNamespace(time=sim.clocks.wall_s, monotonic=sim.clocks.monotonic,
                                                           perf_counter=_time.perf_counter, sleep=_forbidden)),
    ("pysyncobj.syncobj", "time", lambda sim: SimpleNamespace(time=sim.clocks.wall_s, sleep=_forbidden)),
    ("meta.group_sessions", "time",
     lambda sim: SimpleNamespace(time=sim.clocks.wall_s, monotonic=sim.clocks.monotonic)),
    ("meta.reads", "time", lambda sim: SimpleNamespace(monotonic=sim.clocks.monotonic)),
    # randomness (election timeouts: random.random in pysyncobj, random.uniform in the shim; HELLO nonces)
    ("pysyncobj.syncobj", "random", lambda sim: _Rng(sim)),
    ("pysyncobj.dns_resolver", "random", lambda sim: _Rng(sim)),
    ("meta.raft.pysyncobj_shim", "random", lambda sim: _Rng(sim)),
    ("meta.raft.transport", "os", lambda sim: SimpleNamespace(urandom=sim.rng.randbytes)),
    ("meta.raft.read_index", "os", lambda sim: _Counter()),
    # sockets, the poller and the pipe notifier
    ("meta.raft.transport", "socket", lambda sim: sim.net.socket_module),
    ("meta.raft.node", "LoopPoller", lambda sim: sim.new_poller),   # what the node hands pysyncobj as its poller
    ("pysyncobj.syncobj", "PIPE_NOTIFIER_ENABLED", lambda sim: False),
    # the node's files and process
    ("meta.raft.node", "journal_io", lambda sim: sim.journal_io_of_booting_node),
    ("meta.raft.node", "disk_identity", lambda sim: SimpleNamespace(load_or_create=sim.disk_identity)),
    ("meta.raft.node", "Applier", lambda sim: sim.applier_class),
    ("meta.raft.node", "os", lambda sim: _OsProxy()),
    ("meta.raft.node", "gc", lambda sim: SimpleNamespace(freeze=lambda: None)),
    # the meta service behind the HTTP API (schedules with brokers, Sim.http), and aiohttp's connects on the vnet
    ("meta.service", "time", lambda sim: SimpleNamespace(time=sim.clocks.wall_s)),
    ("meta.service", "uuid", lambda sim: _Counter()),
    ("meta.broker_sessions", "time", lambda sim: SimpleNamespace(time=sim.clocks.wall_s, monotonic=sim.clocks.monotonic)),
    ("meta.route_warmer", "time", lambda sim: SimpleNamespace(monotonic=sim.clocks.monotonic)),
    ("meta.forwarder", "time", lambda sim: SimpleNamespace(monotonic=sim.clocks.monotonic)),
    ("aiohttp.connector", "aiohappyeyeballs", lambda sim: vnet.happy_eyeballs()),
    # the brokers (ops/sim/brokers.py) and the chaos runner's workloads and read-back that drive them
    *((module, "time", lambda sim: _SimTime(sim)) for module in BROKER_CLOCK_MODULES),
    ("broker.meta_link", "WATCH_BACKOFF", lambda sim: _seeded_backoff(sim, "broker.meta_link", "WATCH_BACKOFF")),
    ("wire.disk_identity", "secrets", lambda sim: _Counter()),
    ("broker.storage.queue", "secrets", lambda sim: _Counter()),
    ("broker.storage.store", "secrets", lambda sim: _Counter()),
    ("broker.pop.handles", "secrets", lambda sim: _Counter()),
]


def target(module: str, attribute: str) -> tuple[Any, Any]:
    mod = importlib.import_module(module)
    if not hasattr(mod, attribute):
        raise AttributeError(f"the simulator swaps {module}.{attribute}, which no longer exists: update ops/sim/clock.py")
    return mod, getattr(mod, attribute)


@contextlib.contextmanager
def patched(sim: Any) -> Iterator[None]:
    """Every stopgap of PATCHES pointed at ``sim``, undone on exit (tests run the simulator in the pytest process)."""
    saved = []
    try:
        for module, attribute, factory in PATCHES:
            mod, original = target(module, attribute)
            saved.append((mod, attribute, original))
            setattr(mod, attribute, factory(sim))
        yield
    finally:
        for mod, attribute, original in reversed(saved):
            setattr(mod, attribute, original)
