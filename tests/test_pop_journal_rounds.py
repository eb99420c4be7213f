"""The pop journal's rounds and waits (broker/pop/journal.py), on the real Journal over a file in tmp_path: what a
round writes and when the round task runs one, the refusals of a wait word for word, what a failed round or write
tells an operator, the round's answers with copies (broker/replication/pop_copies.py, over the routes and tracker of
tests/support/replica_leader.py's Leader, their pushes answered by a stand-in of the other brokers), the compaction's
bounds, and the refusals of a file that is not a pop journal (the journal's and the copy's file, replica.py)."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
import structlog

from broker.peers import Unreachable
from broker.pop import journal as journal_mod
from broker.pop import replica as replica_mod
from broker.pop.limits import DELIVERY_WRITE_DELAY_MS
from broker.pop.state import QueueState
from broker.replication.pop_copies import PopCopies
from broker.storage import lines
from broker.storage.errors import CorruptFile, UnsupportedFormat
from tests.support.disk_errors import eio
from tests.support.pop_node import WAIT_S, told, until
from tests.support.replica_leader import Leader, failed_over
from wire.errors import ApiError

KEY = ("g", "t", 0)
OTHER = ("h", "t", 0)
LATER = DELIVERY_WRITE_DELAY_MS


def popped(key, offsets, now: int = 0) -> QueueState:
    st = QueueState(key, min(offsets, default=0))
    for o in offsets:
        st.deliver_new(o, o + 1, now, 60_000)
    return st


def file_lines(path) -> list:
    return lines.read(str(path)).values


def journal(tmp_path, clock=None, name: str = "journal.log") -> journal_mod.Journal:
    path = str(tmp_path / name)
    states, whole = journal_mod.load(path)
    return journal_mod.Journal(path, states, whole, now_ms=(lambda: clock[0]) if clock else (lambda: LATER))


async def stopped(j: journal_mod.Journal) -> None:
    j.copies = None
    await j.close()


# -- what a round writes --------------------------------------------------------------------------------------------

async def test_lines_written_counts_every_line_of_every_round_from_zero(tmp_path):
    j = journal(tmp_path)
    assert j.lines_written == 0, "the metric starts at 0"
    a = j.states[KEY] = popped(KEY, [0])
    j.touch(KEY)
    await j.round()
    assert j.lines_written == 1
    b = j.states[OTHER] = popped(OTHER, [0])
    a.ack(0)
    j.touch(KEY)
    j.touch(OTHER)
    await j.round()
    assert j.lines_written == 3 and len(file_lines(j.path)) == 3
    b.ack(0)
    await stopped(j)
    assert j.lines_written == 4


async def test_a_round_leaves_out_a_first_delivery_inside_its_write_delay_unless_forced(tmp_path):
    clock = [0]
    j = journal(tmp_path, clock)
    j.states[KEY] = popped(KEY, [0, 1])
    j.touch(KEY)
    await j.round()
    assert [(v[3], v[7]) for v in file_lines(j.path)] == [(0, [])], \
        "popped just now: not written yet (an ack within the delay cancels the pair), nor the pop offset past them"
    clock[0] = LATER
    await j.round()
    assert [(v[3], v[7]) for v in file_lines(j.path)][1:] == [(2, [[0, 1, 1, 60_000, 0], [1, 2, 1, 60_000, 0]])]
    await stopped(j)


async def test_a_touched_key_with_no_state_does_not_stop_the_round_from_writing_the_others(tmp_path):
    """Keys are looked at in a set's order: whichever comes first, every key with a state gets its line."""
    for trial in range(6):
        j = journal(tmp_path, name=f"j{trial}.log")
        keys = [(f"g{trial}-{i}", "t", 0) for i in range(12)]
        for k in keys:
            j.states[k] = popped(k, [0])
            j.touch(k)
        j.touch((f"gone{trial}", "t", 0))          # its state was dropped after the touch
        await j.round()
        assert sorted(tuple(v[:3]) for v in file_lines(j.path)) == sorted(keys)
        await stopped(j)


async def test_a_wait_is_answered_by_a_round_of_a_journal_without_copies(tmp_path):
    j = journal(tmp_path)
    j.states[KEY] = popped(KEY, [0])
    j.touch(KEY)
    wait = asyncio.create_task(j.durable(confirm={("t", 0)}))
    await asyncio.sleep(0)
    await j.round()
    async with asyncio.timeout(WAIT_S):
        assert await wait is None
    await stopped(j)


async def test_close_writes_every_state_in_memory_touched_or_not(tmp_path):
    j = journal(tmp_path)
    j.states[KEY] = popped(KEY, [0, 1])     # never touched, popped just now
    await j.close()
    back, _ = journal_mod.load(j.path)
    assert sorted(back[KEY].in_flight) == [0, 1] and back[KEY].next_offset == 2


# -- when the round task runs one ------------------------------------------------------------------------------------

@pytest.fixture
def slow_idle(monkeypatch):
    """An idle round task waits 30 s: a round within the test's wait came from a wake-up or a tick."""
    monkeypatch.setattr(journal_mod, "IDLE_WAKE_S", 30.0)


async def test_an_idle_journal_runs_no_round_until_something_is_touched(tmp_path, slow_idle):
    reads = []
    path = str(tmp_path / "journal.log")
    states, whole = journal_mod.load(path)
    j = journal_mod.Journal(path, states, whole, now_ms=lambda: reads.append(1) or LATER)
    j.start()
    await asyncio.sleep(0.3)
    assert reads == [], "idle: no round ticks while nothing changed"
    j.states[KEY] = popped(KEY, [0])
    j.touch(KEY)                              # the first change wakes the idle task
    await until(lambda: j.lines_written == 1)
    await stopped(j)


async def test_a_first_delivery_still_maturing_is_looked_at_again_at_the_next_tick(tmp_path, slow_idle):
    clock = [0]
    j = journal(tmp_path, clock)
    j.states[KEY] = popped(KEY, [0])
    j.start()
    j.touch(KEY)
    await until(lambda: j.lines_written == 1)  # looked at: its key's line, the delivery still inside its delay
    assert [v[7] for v in file_lines(j.path)] == [[]]
    clock[0] = LATER                          # no touch: the round task looks at it again by itself
    await until(lambda: j.lines_written == 2)
    assert [v[7] for v in file_lines(j.path)][1] == [[0, 1, 1, 60_000, 0]]
    await stopped(j)


async def test_a_round_that_fails_is_told_and_fails_every_later_wait_at_once(tmp_path, monkeypatch):
    """Not a disk error (an OSError is told as a failed write): the round task says so and the journal is failed."""
    j = journal(tmp_path)
    j.states[KEY] = popped(KEY, [0])

    def broken(data):
        raise RuntimeError("a bug")

    monkeypatch.setattr(j, "_write", broken)
    with structlog.testing.capture_logs() as logs:
        j.start()
        j.touch(KEY)
        await until(lambda: told(logs, "pop_journal_round_failed"))
    [event] = told(logs)
    assert event["event"] == "pop_journal_round_failed" and "exc_info" in event
    async with asyncio.timeout(2):           # at once, not after JOURNAL_WAIT_S
        with pytest.raises(ApiError) as e:
            await j.durable()
    assert (e.value.status, e.value.code) == (503, "STORAGE_UNAVAILABLE")
    j._task.cancel()
    await asyncio.gather(j._task, return_exceptions=True)
    os.close(j._fd)


async def test_a_round_that_raises_answers_the_waits_it_took_at_once(tmp_path, monkeypatch):
    """A bug in a round (not a disk error): the waits it took are refused now, not after JOURNAL_WAIT_S."""
    j = journal(tmp_path)
    j.states[KEY] = popped(KEY, [0])

    def broken(data):
        raise RuntimeError("a bug")

    monkeypatch.setattr(j, "_write", broken)
    j.touch(KEY)
    wait = asyncio.create_task(j.durable())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError):
        await j.round()
    async with asyncio.timeout(2):
        with pytest.raises(ApiError) as e:
            await wait
    assert (e.value.status, e.value.code) == (503, "STORAGE_UNAVAILABLE")
    os.close(j._fd)


async def test_a_round_cancelled_while_it_writes_answers_the_waits_it_took_at_once(tmp_path, monkeypatch):
    j = journal(tmp_path)
    j.states[KEY] = popped(KEY, [0])
    entered, release = threading.Event(), threading.Event()
    real = j._write

    def held(data):
        entered.set()
        release.wait(WAIT_S)
        real(data)

    monkeypatch.setattr(j, "_write", held)
    j.touch(KEY)
    wait = asyncio.create_task(j.durable())
    await asyncio.sleep(0)
    rnd = asyncio.create_task(j.round())
    await until(entered.is_set)
    rnd.cancel()
    try:
        async with asyncio.timeout(2):
            with pytest.raises(ApiError) as e:
                await wait
        assert (e.value.status, e.value.code) == (503, "STORAGE_UNAVAILABLE")
    finally:
        release.set()
    with pytest.raises(asyncio.CancelledError):
        await rnd
    await stopped(j)


async def test_a_failed_write_is_told_with_its_file_and_error(tmp_path, monkeypatch):
    j = journal(tmp_path)
    j.states[KEY] = popped(KEY, [0])
    j.touch(KEY)
    monkeypatch.setattr(j, "_write", eio)
    with structlog.testing.capture_logs() as logs:
        await j.round()
    assert told(logs) == [{"event": "pop_journal_write_failed", "path": j.path,
                           "error": "[Errno 5] Input/output error"}]
    os.close(j._fd)


# -- the waits' refusals --------------------------------------------------------------------------------------------

async def test_a_wait_past_the_waiters_bound_is_refused_word_for_word(tmp_path, monkeypatch):
    monkeypatch.setattr(journal_mod, "JOURNAL_WAITERS_MAX", 2)
    j = journal(tmp_path)
    waits = [asyncio.create_task(j.durable()) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(ApiError) as e:
        await j.durable()
    assert (e.value.status, e.value.code, e.value.message, e.value.details) == (
        503, "TOO_MANY_WAITERS", "too many pop acks wait for the disk; retry shortly", {"limit": 2})
    await j.round()
    assert await asyncio.gather(*waits) == [None, None]
    await stopped(j)


async def test_a_wait_no_round_confirms_within_the_bound_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(journal_mod, "JOURNAL_WAIT_S", 0.2)
    j = journal(tmp_path)                     # no round task: nothing confirms
    async with asyncio.timeout(WAIT_S):
        with pytest.raises(ApiError) as e:
            await j.durable()
    assert (e.value.status, e.value.code) == (503, "STORAGE_UNAVAILABLE")
    await stopped(j)


# -- compaction's bounds ----------------------------------------------------------------------------------------------

async def test_compaction_waits_for_more_lines_than_its_bound_and_more_than_twice_the_keys(tmp_path, monkeypatch):
    monkeypatch.setattr(journal_mod, "COMPACT_AFTER_LINES", 4)
    j = journal(tmp_path)
    st = j.states[KEY] = popped(KEY, list(range(6)))
    j.touch(KEY)
    await j.round()
    for o in range(3):
        st.ack(o)
        j.touch(KEY)
        await j.round()
    assert len(file_lines(j.path)) == 4, "4 lines: not more than the bound yet"
    await stopped(j)

    monkeypatch.setattr(journal_mod, "COMPACT_AFTER_LINES", 3)
    j = journal(tmp_path, name="two.log")
    a = j.states[KEY] = popped(KEY, [0, 1, 2])
    b = j.states[OTHER] = popped(OTHER, [0, 1, 2])
    j.touch(KEY)
    j.touch(OTHER)
    await j.round()
    a.ack(0)
    b.ack(0)
    j.touch(KEY)
    j.touch(OTHER)
    await j.round()
    assert len(file_lines(j.path)) == 4, "4 lines of 2 keys: not more than twice the keys"
    a.ack(1)
    j.touch(KEY)
    await j.round()
    assert len(file_lines(j.path)) == 2, "5 lines: compacted to one per key"
    await stopped(j)


# -- rounds with copies ------------------------------------------------------------------------------------------------

class Pushes:
    """The other brokers taking the journal's pushes; ``then`` runs at the first one (and may raise)."""

    def __init__(self, then=None):
        self.got: list[tuple[str, bool, list]] = []
        self.then = then

    async def call(self, method, broker, address, path, body):
        self.got.append((broker, body["reset"], body["lines"]))
        then, self.then = self.then, None
        if then is not None:
            then()


def with_copies(tmp_path, peers: Pushes) -> tuple[journal_mod.Journal, Leader, QueueState]:
    lead = Leader(["b1", "b2"])
    j = journal(tmp_path)
    st = j.states[KEY] = popped(KEY, [7, 8])
    j.copies = PopCopies("b1", lead.routes, lead.tracker, peers)
    return j, lead, st


async def waited(j: journal_mod.Journal, confirm=(("t", 0),)):
    """A wait and the round that answers it (the wait taken first, as an ack's is); the round itself raises
    nothing (what went wrong is the wait's answer)."""
    wait = asyncio.create_task(j.durable(confirm=set(confirm)))
    await asyncio.sleep(0)
    assert await asyncio.gather(j.round(), return_exceptions=True) == [None]
    async with asyncio.timeout(WAIT_S):
        return await wait


async def test_a_copy_that_asks_for_the_queue_whole_gets_every_state_of_it_at_the_next_round(tmp_path):
    peers = Pushes()
    j, lead, st = with_copies(tmp_path, peers)
    j.copies.ready(lead.head, "b3")           # a joining copy: the queue's whole state at the next round
    j.touch(KEY)
    assert await waited(j) is None
    full = [["g", "t", 0, 9, 0, False, 0, [[7, 8, 1, 60_000, 0], [8, 9, 1, 60_000, 0]], []]]
    assert sorted((b, reset, ls) for b, reset, ls in peers.got if b == "b3") == [("b3", True, full)]
    await stopped(j)


async def test_a_push_a_waited_copy_did_not_take_fails_the_round_s_waits_with_its_answer(tmp_path):
    """The head moved on while the round pushed (a failover): the ack is in doubt, answered REPLICATION_UNCONFIRMED,
    and the journal goes on (a refusal of the copies is no failure of the disk)."""
    j, lead = None, None

    def moved_on():
        lead.routes.update(failed_over(2, lost="b1", elected="b2"))
        raise Unreachable("connection refused")

    peers = Pushes(moved_on)
    j, lead, st = with_copies(tmp_path, peers)
    st.ack(7)
    j.touch(KEY)
    with pytest.raises(ApiError) as e:
        await waited(j)
    assert (e.value.code, e.value.message) == (
        "REPLICATION_UNCONFIRMED", "the queue's head moved on before copy b2 stored the pop state (connection "
        "refused): the pop state is stored on the leader but not confirmed by its copies; a failover may keep it or "
        "not: send again")
    assert not j._failed
    j.touch(KEY)
    assert await waited(j, ()) is None, "the next round answers ok"
    await stopped(j)


async def test_an_ack_of_a_queue_whose_head_moved_away_is_in_doubt_word_for_word(tmp_path):
    j, lead, st = with_copies(tmp_path, Pushes())
    lead.routes.update(failed_over(2, lost="b1", elected="b2"))
    st.ack(7)
    j.touch(KEY)
    with pytest.raises(ApiError) as e:
        await waited(j)
    assert (e.value.status, e.value.code, e.value.message, e.value.details) == (
        503, "REPLICATION_UNCONFIRMED", "the queue's head moved away from this broker before its copies stored the "
        "pop state: the pop state is stored on the leader but not confirmed by its copies; a failover may keep it or "
        "not: send again", {"topic": "t", "queue": 0})
    await stopped(j)


async def test_a_failed_write_beats_a_moved_head_in_the_answer(tmp_path, monkeypatch):
    """Nothing of the round is stored at all: STORAGE_UNAVAILABLE, not 'stored on the leader'."""
    j, lead, st = with_copies(tmp_path, Pushes())
    lead.routes.update(failed_over(2, lost="b1", elected="b2"))
    st.ack(7)
    j.touch(KEY)
    monkeypatch.setattr(j, "_write", eio)
    with pytest.raises(ApiError) as e:
        await waited(j)
    assert (e.value.status, e.value.code) == (503, "STORAGE_UNAVAILABLE")
    os.close(j._fd)


# -- files that are not pop journals -----------------------------------------------------------------------------------

def written(path, value) -> None:
    with open(path, "wb") as f:
        f.write(lines.encode(value))


@pytest.mark.parametrize("module, what, bad", [
    (journal_mod, "pop journal", ["g", "t", 0, "x" * 300]),
    (replica_mod, "replica pop", ["L", "x" * 300]),
])
def test_a_good_line_that_is_not_a_line_of_the_file_is_refused_naming_the_file_the_line_and_its_start(
        tmp_path, module, what, bad):
    path = str(tmp_path / "f.log")
    written(path, bad)
    with pytest.raises(CorruptFile) as e:
        module.load(path)
    assert e.value.message == (f"{path}: good line 1 that passed its check is not a {what} line: "
                               f"{str(bad)[:200]}")
    assert e.value.details == {"path": path}


@pytest.mark.parametrize("module, old, why", [
    (journal_mod, ["g", "t", 0, 1, 0, False, [], []],
     "a pop journal line of Stator 0.1 (8 fields; this build writes 9, with moved_below)"),
    (replica_mod, ["R", "t", 0], "a reset line of Stator 0.1 (no gen: it dropped every state of the queue)"),
])
def test_a_line_of_the_older_format_is_refused_by_name(tmp_path, module, old, why):
    path = str(tmp_path / "f.log")
    written(path, old)
    with pytest.raises(UnsupportedFormat) as e:
        module.load(path)
    assert e.value.message == f"{path}: good line 1: {why}"
    assert e.value.details == {"path": path}
