"""The broker's reads: a pull over a queue's whole history, across segments on this and other brokers.

A pull addressed to the broker that holds the queue's newest segment serves every older segment too (API.md). Data
on live brokers never waits on a dead one: the oldest segment's min offset is cached and, when its broker is down,
reported as that segment's start with the unreachable range named; a read that reaches a range on a down broker
answers what it has, or 503 BROKER_UNAVAILABLE naming the range when it has nothing yet (broker/peers.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from wire.errors import ApiError, rejection

from . import lag
from .codec import RawRecord, run_of, stored_record
from .meta_link import MetaLink
from .metrics import BrokerMetrics
from .offset_witness import WitnessLog
from .offsets import Committed, Key, OffsetStore, newer
from .peers import Peers, Unreachable, unavailable
from .replication.follower import physical_end
from .replication.offsets import TABLE_PAGES_MAX
from .routing import RouteTable, Segment
from .storage import OffsetOutOfRange, Run
from .storage_threads import StorageThreads
from .writes import Writer, not_leader

PULL_BYTES_MAX = 8 * 1024 * 1024
READER_THREADS = 8               # local reads at once (page cache mostly; a queue's lock may be held by an fsync)
MIN_OFFSET_CACHE_S = 1.0          # how long another broker's min offset of an older segment is trusted
REMOTE_MIN_OFFSETS_CACHED_MAX = 100_000
OLDER_CHAINS_CACHED_MAX = 1_024   # queues whose segments older than their route's are kept from meta


def _physical_path(seg: Segment, **params: int) -> str:
    """A read of ``seg``'s physical queue at its broker, telling it where the log says the queue starts."""
    query = "&".join(f"{k}={v}" for k, v in {**params, "start": seg.physical_start}.items())
    return f"/v1/physical/{seg.physical_queue}?{query}"


class Reader:
    def __init__(self, me: str, routes: RouteTable, writer: Writer, offsets: OffsetStore, witness: WitnessLog,
                 peers: Peers, link: MetaLink, metrics: BrokerMetrics | None = None, driven: bool = False):
        self.me = me
        self.metrics = metrics
        self.routes = routes
        self.writer = writer
        self.offsets = offsets
        self.witness = witness
        self.peers = peers
        self.link = link
        self._threads = StorageThreads(READER_THREADS, "read", driven)   # driven: no thread (BrokerNode's)
        self._remote_min: dict[str, tuple[int, float]] = {}        # physical queue -> (min offset, expires)
        self._older: OrderedDict[str, list[Segment]] = OrderedDict()  # first carried pq -> older segments (LRU)

    def stop(self) -> None:
        self._threads.stop()

    # -- the segment chain -------------------------------------------------------------------------------------
    def _carried(self, topic: str, queue: int) -> list[Segment]:
        segs = self.routes.segments(topic, queue)
        if topic not in self.routes.routes or not segs:
            raise rejection(404, "TOPIC_NOT_FOUND", f"topic {topic!r} queue {queue} is unknown to this broker")
        if segs[-1].broker != self.me:
            raise not_leader(topic, queue, segs[-1])
        return segs

    async def _chain(self, topic: str, queue: int) -> list[Segment]:
        """Every segment of the queue with a decided logic start, oldest first."""
        return await self._history(topic, queue, self._carried(topic, queue))

    async def _history(self, topic: str, queue: int, segs: list[Segment]) -> list[Segment]:
        """The decided segments of ``segs`` (a route's newest ones) with the older ones before them."""
        if segs[0].gen > 0:  # the route carries only the newest segments: older ones are sealed, so cacheable
            key = segs[0].physical_queue
            older = self._older.get(key)
            if older is None:
                full = await self.link.queue_segments(topic, queue, self.routes.version)
                older = [s for s in full if s.gen < segs[0].gen]
                self._older[key] = older
                while len(self._older) > OLDER_CHAINS_CACHED_MAX:
                    self._older.popitem(last=False)
            else:
                self._older.move_to_end(key)
            segs = older + segs
        return [s for s in segs if s.logic_start is not None]

    # -- pull --------------------------------------------------------------------------------------------------
    async def pull(self, topic: str, queue: int, offset: int, max_n: int,
                   held_by: dict[str, Any] | None = None) -> dict[str, Any]:
        """Messages from ``offset`` on; with ``held_by`` (a barrier the group has not passed) only the queue's bounds."""
        return await self._pull_decided(topic, await self._chain(topic, queue), offset, max_n, held_by)

    async def read_history(self, topic: str, queue: int, offset: int, max_n: int) -> dict[str, Any]:
        """A pull that does not need this broker to hold the head: pop state kept for a sealed segment (pop across
        remaps) reads its messages for the dead-letter queue wherever they are."""
        return await self._pull_decided(topic, await self.history(topic, queue), offset, max_n, None)

    async def history(self, topic: str, queue: int) -> list[Segment]:
        """Every decided segment of the queue, oldest first, whichever broker holds its head."""
        segs = self.routes.segments(topic, queue)
        if topic not in self.routes.routes or not segs:
            raise rejection(404, "TOPIC_NOT_FOUND", f"topic {topic!r} queue {queue} is unknown to this broker")
        return await self._history(topic, queue, segs)

    async def _pull_decided(self, topic: str, decided: list[Segment], offset: int, max_n: int,
                            held_by: dict[str, Any] | None) -> dict[str, Any]:
        min_offset, gaps = await self._min_offset(decided[0])
        max_offset = await self._max_offset(decided[-1])
        out: dict[str, Any] = {"messages": [], "next_offset": offset, "min_offset": min_offset,
                               "max_offset": max_offset}
        if gaps:
            out["unavailable"] = gaps
        if held_by is not None:
            out["held_by"] = held_by
            return out
        if offset < min_offset:
            out["next_offset"] = min_offset        # below the oldest kept message: move forward, never back
            return out
        if offset >= max_offset:
            out["next_offset"] = max_offset if offset > max_offset else offset
            return out
        runs: list[Run] = []
        taken = 0
        cursor = offset
        for i, seg in enumerate(decided):
            end = seg.logic_end if seg.logic_end is not None else (
                decided[i + 1].logic_start if i + 1 < len(decided) else None)
            if end is not None and cursor >= end:
                continue
            want = max_n - taken if end is None else min(max_n - taken, end - cursor)
            try:
                read, physical_max = await self._read(seg, seg.physical(cursor), want)
            except ApiError as e:
                if e.code != "BROKER_UNAVAILABLE" or not runs:
                    raise
                break  # answer what the live brokers gave; the next pull names the unreachable range
            for run in read:
                runs.append(run._replace(offset=seg.logic(run.offset)))
                taken += run.count
                cursor = runs[-1].offset + run.count
            if taken >= max_n or end is None:
                break
            if cursor < seg.logic(physical_max):
                break  # the read stopped at its byte budget inside this segment
            # This segment is exhausted; anything between its last message and its end is the bounded gap of a
            # broker that died before sealing: move on to the next segment's start.
            cursor = end
        out["messages"] = runs
        out["next_offset"] = cursor
        if self.metrics is not None:
            self.metrics.served(topic, taken, sum(run.payload_bytes for run in runs))
        return out

    async def _read(self, seg: Segment, physical: int, max_n: int) -> tuple[list[Run], int]:
        """Runs of records from ``physical`` on, and the segment's physical end as far as its holder knows: here when
        this broker leads it (below the high watermark) or holds a whole copy of it, else at a broker holding it."""
        end = physical_end(seg)
        if end is not None:   # sealed: here if this broker's copy is whole (it may be back on a new disk)
            if self.me in seg.replicas and self.writer.max_physical(seg) >= end:
                return await self._read_here(seg, physical, max_n, end)
        elif (seg.sealer or seg.broker) == self.me:   # led here, or being sealed at this copy's end
            return await self._read_here(seg, physical, max_n, self.writer.readable_physical(seg))
        holders = self._holders(seg)
        if not holders and end is not None and self.me in seg.replicas:
            # Sealed past what this broker, its only holder, wrote: what it holds is all there is. A head fenced
            # before it wrote what it was given is sealed at its budget end (it could not report its end); the rest
            # is a bounded gap, which a pull through any other broker (asking this one) passes over, and a pull
            # here was refused for ever (the simulator, seed 1 with broker partitions).
            return await self._read_here(seg, physical, max_n, self.writer.max_physical(seg))
        best: tuple[list[Run], int] | None = None
        failed: ApiError | None = None
        for holder in holders:
            try:
                body = await self.peers.get(holder, _physical_path(seg, offset=physical, max=max_n))
            except ApiError as e:
                if e.code != "BROKER_UNAVAILABLE":
                    raise
                failed = failed or e
                continue
            got = [run_of(stored_record(r)) for r in body["records"]], body["max_offset"]
            # A copy that ends short of the segment's end (a broker back on a new disk, catching up) is not the
            # segment's end: another holder has the rest.
            if got[0] or end is None or got[1] >= end:
                return got
            best = got if best is None or got[1] > best[1] else best
        if best is not None:
            return best
        raise failed or unavailable(seg, "no broker holds it")

    async def _read_here(self, seg: Segment, physical: int, max_n: int, end: int) -> tuple[list[Run], int]:
        pq = self.writer.local_queue(seg)
        if pq is None:
            return [], seg.physical_start
        start = max(physical, pq.min_offset)
        max_n = min(max_n, end - start)
        if max_n <= 0:
            return [], end
        try:
            # On the loop when the records are in the page cache: 0.24 ms of CPU per pull of 100 x 1 KB
            # instead of 0.29-0.33 through a thread (broker_throughput's consume). Else in a thread: the disk, or
            # the queue's lock held by an append's fsync, would stall every request.
            runs = pq.try_read_runs(start, max_n, PULL_BYTES_MAX)
            if runs is None:
                runs = await self._threads.run(pq.read_runs, start, max_n, PULL_BYTES_MAX)
            return runs, end
        except OffsetOutOfRange:
            return [], end

    def _holders(self, seg: Segment) -> list[Segment]:
        """``seg`` as each broker that may serve it holds it, in the order to ask: an open segment at its leader; a
        segment being sealed at its sealer only (another copy may hold records past the end the sealer reports);
        a sealed one at its sealer, its leader, then its other copies."""
        if seg.state == "active":
            names = [seg.broker]
        elif seg.state == "sealing":
            names = [seg.sealer or seg.broker]
        else:
            names = list(dict.fromkeys([seg.sealer or seg.broker, seg.broker, *seg.in_sync, *seg.replicas]))
        out = []
        for b in names:
            if b == self.me:
                continue
            out.append(seg if b == seg.broker else dataclasses.replace(seg, broker=b,
                                                                         address=self.routes.address(seg.topic, b)))
        return out

    async def _min_offset(self, seg: Segment) -> tuple[int, list[dict[str, Any]]]:
        """The queue's min offset and, when no broker holding it answers, the range that cannot be read now."""
        if (seg.sealer or seg.broker) == self.me:
            pq = self.writer.local_queue(seg)
            return (seg.logic(pq.min_offset) if pq is not None else seg.logic_start), []
        cached = self._remote_min.get(seg.physical_queue)
        if cached is not None and cached[1] > time.monotonic():
            return cached[0], []
        body = None
        for holder in self._holders(seg):
            try:
                body = await self.peers.get(holder, _physical_path(seg, offset=0, max=0))
                break
            except ApiError as e:
                if e.code != "BROKER_UNAVAILABLE":
                    raise
        if body is None:
            return seg.logic_start, [{"broker": seg.broker, "from": seg.logic_start, "to": seg.logic_end}]
        low = seg.logic(body["min_offset"])
        if len(self._remote_min) >= REMOTE_MIN_OFFSETS_CACHED_MAX:
            self._remote_min.clear()  # entries live a second: dropping them all costs one more ask each
        self._remote_min[seg.physical_queue] = (low, time.monotonic() + MIN_OFFSET_CACHE_S)
        return low, []

    async def _max_offset(self, seg: Segment) -> int:
        if seg.logic_end is not None:
            return seg.logic_end
        if (seg.sealer or seg.broker) == self.me:
            return seg.logic(self.writer.readable_physical(seg))
        body = await self.peers.get(self._holders(seg)[0], _physical_path(seg, offset=0, max=0))
        return seg.logic(body["max_offset"])

    # -- answers for other brokers -----------------------------------------------------------------------------
    async def physical_read(self, pq_name: str, offset: int, max_n: int, ts_ms: int | None = None,
                            start: int | None = None) -> dict[str, Any]:
        """Records of a physical queue stored here, for the broker holding the queue's head. Older segments may have
        left this broker's routes (a route carries only the newest), so the store, not the routes, decides.

        A queue the log gave this broker but that is not in its store was never created here, so nothing was ever
        acknowledged in it (a queue exists on disk, directory synced, before its first append is answered): a
        broker that lost power before it got to create a new head's queue. It is empty from its start, which the
        routes give, or the asking head (``start``, from the log) once the segment left them; without either, 404.
        Answering 404 there made every pull across that range fail for good (the chaos runner's read-back)."""
        seg = self.routes.hosted.get(pq_name)
        if start is None and seg is not None:
            start = seg.physical_start
        if pq_name in self.writer.store:
            pq = self.writer.store.get(pq_name)
        elif start is not None:
            return {"records": [], "min_offset": start, "max_offset": start, "offset_for_time": start}
        else:
            raise rejection(404, "QUEUE_NOT_FOUND", f"no physical queue {pq_name!r} here")
        records = []
        if max_n > 0 and offset < pq.max_offset:
            read = await self._threads.run(pq.read, max(offset, pq.min_offset), max_n, PULL_BYTES_MAX)
            records = [RawRecord(r.offset, r.ts_ms, r.payload) for r in read]
        out = {"records": records, "min_offset": pq.min_offset, "max_offset": pq.max_offset}
        if ts_ms is not None:
            out["offset_for_time"] = await self._threads.run(pq.offset_for_time, ts_ms)
        return out

    # -- offsets and stats -------------------------------------------------------------------------------------
    async def read_offset(self, group: str, topic: str, queue: int, local_only: bool) -> int:
        return (await self.read_committed(group, topic, queue, local_only))[0]

    async def committed_at_head(self, group: str, topic: str, queue: int) -> int:
        """The group's committed offset of a queue whose head may be on another broker (a growth barrier's old
        queue): read here when the head is here, else asked of the head, which alone may answer."""
        head = self.routes.head(topic, queue)
        if head is None:
            raise rejection(404, "QUEUE_NOT_FOUND", f"topic {topic!r} queue {queue} is unknown to this broker",
                            topic=topic, queue=queue)
        if head.broker == self.me:
            return await self.read_offset(group, topic, queue, False)
        body = await self.peers.get(head, f"/v1/offsets/{quote(group, safe='')}/{quote(topic, safe='')}/{queue}")
        return body["offset"]

    async def read_committed(self, group: str, topic: str, queue: int, local_only: bool) -> tuple[int, int]:
        """(offset, gen of the head it was committed on); (-1, -1) when never. ``local_only``: this broker's own
        value, for a head walking the queue's older brokers.

        Answered by the queue's head only, and only while it may take writes (Writer.offsets_head): a broker whose
        routes are behind, whose segment was sealed or whose session lapsed cannot know of a newer head's commits.
        The newest commit wins wherever it is: the head's own when made on the current head, else the highest gen
        held by the brokers of the queue's segments (a queue that moved away and back must not read the value it
        left behind). A segment's commits are on its leader and on every copy of its in-sync set and its sealer
        (replication/offsets.py), so the segments are walked newest first and each one's holders not asked yet are
        asked at once, while the segment could beat what is known (a commit's gen is that of the segment it was made
        on). A segment is settled by the answer of a holder whose disk holds its commits (offset_witness.py: a
        holder back on a new disk is still named, and holds none). None answering, while one is down, makes the read
        503 BROKER_UNAVAILABLE (retry), never an older value: after a power loss of the whole machine, a new head
        answered -1 for a queue whose commit of 761 sat on the previous head, still starting; and holders back on
        empty disks answered -1 while the one copy holding a commit was down (the chaos runner's committed_offsets
        check, seed 7). The walk: ``_ask_holders``."""
        own = self.offsets.get_committed(group, topic, queue)
        best = (own.offset, own.gen) if own is not None else (-1, -1)
        if local_only:
            return best
        head = self.writer.offsets_head(topic, queue)
        if own is not None and own.gen >= head.gen:
            return best

        def take(answer: tuple[int, int]) -> None:
            nonlocal best
            if answer[0] >= 0 and answer[1] > best[1]:
                best = answer

        def unavailable(seg: Segment, holders: list[str]) -> ApiError:
            return rejection(503, "BROKER_UNAVAILABLE", f"the committed offset of {group!r} on {topic}/{queue} may be "
                             f"newer on the brokers that held its segment of gen {seg.gen} ({', '.join(holders)}), "
                             "none of which answers now holding it; retry", broker=seg.broker, gen=seg.gen)

        # Walked while a segment could beat what is known: no holder of an older one can hold a newer commit
        await self._ask_holders(head, lambda b: self._held_offset(topic, queue, group, b), take,
                                lambda seg: seg.gen <= best[1], unavailable)
        self.writer.still_offsets_head(head, "its committed offset was read")
        return best

    async def older_commits(self, head: Segment) -> list[tuple[Key, Committed]]:
        """Every group's newest commit of ``head``'s queue that the brokers of its older segments hold and this
        broker does not: what a head this broker has come to lead takes over (replication/offsets.py), walked as
        ``read_committed`` walks one group's, every older segment, since each group's newest may be on any. 503
        BROKER_UNAVAILABLE when a segment none of whose answering holders holds its commits has a holder that does
        not answer."""
        topic, queue = head.topic, head.queue
        own = dict(self.offsets.queue_values(topic, queue))
        best: dict[Key, Committed] = dict(own)

        def take(values: list[tuple[Key, Committed]]) -> None:
            for key, value in values:
                if newer(value, best.get(key)):
                    best[key] = value

        def unavailable(seg: Segment, holders: list[str]) -> ApiError:
            return rejection(503, "BROKER_UNAVAILABLE", f"the commits of {topic}/{queue} made on its segment of gen "
                             f"{seg.gen} are held by {', '.join(holders)}, none of which answers now holding them",
                             broker=seg.broker, gen=seg.gen)

        await self._ask_holders(head, lambda b: self._held_table(topic, queue, b), take, lambda seg: False,
                                unavailable, older_only=True)
        return sorted((k, v) for k, v in best.items() if newer(v, own.get(k)))

    async def _ask_holders(self, head: Segment, ask: Callable[[str], Awaitable[tuple[Any, frozenset[str]] | None]],
                           take: Callable[[Any], None], enough: Callable[[Segment], bool],
                           unavailable: Callable[[Segment, list[str]], ApiError], older_only: bool = False) -> None:
        """Walks the segments of ``head``'s queue newest first (``older_only``: those before the head) until
        ``enough(seg)``, asking each one's holders (its leader, sealer and in-sync copies) not asked yet: ``ask(b)``
        is (what ``b`` holds, the segments whose commits its disk holds), None when it did not answer; ``take``
        keeps what each holds. A segment is settled by the answer of a holder whose disk holds its commits
        (offset_witness.py: a holder back on a new disk is still named, and holds none); while none that answered
        does and one is down, ``unavailable(seg, holders)`` is raised. Every holder answering and none holding it:
        its commits went with every disk that held them, and the walk goes on."""
        topic, queue = head.topic, head.queue
        # Holders that answered, and the segments whose commits they hold (every commit on the head is made here)
        holds: dict[str, frozenset[str]] = {self.me: self.witness.held(topic, queue) | {head.physical_queue}}
        down: set[str] = set()
        for seg in reversed(await self._chain(topic, queue)):
            if older_only and seg.gen >= head.gen:
                continue
            if enough(seg):
                break
            holders = list(dict.fromkeys(b for b in (seg.broker, seg.sealer, *seg.in_sync) if b))
            asked = [b for b in holders if b not in holds and b not in down]
            answers = await asyncio.gather(*(ask(b) for b in asked))
            for broker, answer in zip(asked, answers):
                if answer is None:
                    down.add(broker)
                    continue
                value, holds[broker] = answer
                take(value)
            if not any(seg.physical_queue in holds.get(b, ()) for b in holders) and down & set(holders):
                raise unavailable(seg, holders)

    async def _held_table(self, topic: str, queue: int,
                          broker: str) -> tuple[list[tuple[Key, Committed]], frozenset[str]] | None:
        """Every commit of the queue ``broker`` holds, and the segments whose commits its disk holds; None when it
        does not answer (or answers what is not that)."""
        out: list[tuple[Key, Committed]] = []
        after: str | None = None
        held: list = []
        for _ in range(TABLE_PAGES_MAX):
            path = f"/v1/replica/offsets/{quote(topic, safe='')}/{queue}"
            if after is not None:
                path += f"?after={quote(after, safe='')}"
            try:
                # A background take-over's retries must not keep a broker back from the dead marked down
                body = await self.peers.call("GET", broker, self.routes.address(topic, broker), path,
                                             remember_down=False)
                out += [((c["group"], topic, queue), Committed(c["offset"], c["gen"], c["seq"]))
                        for c in body["commits"]]
                held, after = body["holds"], body["next"]
            except (ApiError, Unreachable, KeyError, TypeError):
                return None
            if after is None:
                return out, frozenset(h for h in held if isinstance(h, str))
        return None   # pages without end: not an answer

    async def _held_offset(self, topic: str, queue: int, group: str,
                           broker: str) -> tuple[tuple[int, int], frozenset[str]] | None:
        """(offset, gen) of the commit ``broker`` holds ((-1, -1): none), and the segments of the queue whose
        commits its disk holds; None when it does not answer."""
        path = f"/v1/offsets/{quote(group, safe='')}/{quote(topic, safe='')}/{queue}?local=1"
        try:
            body = await self.peers.call("GET", broker, self.routes.address(topic, broker), path)
        except (ApiError, Unreachable):
            return None
        offset, gen, held = body.get("offset", -1), body.get("gen", -1), body.get("holds", [])
        if not (isinstance(offset, int) and isinstance(gen, int) and isinstance(held, list)):
            return None
        return (offset, gen), frozenset(h for h in held if isinstance(h, str))

    async def min_offset(self, topic: str, queue: int) -> int:
        """A queue's min logic offset, wherever its head is (a barrier's old queue may be on another broker)."""
        segs = self.routes.segments(topic, queue)
        if not segs:
            raise rejection(404, "QUEUE_NOT_FOUND", f"topic {topic!r} queue {queue} is unknown to this broker",
                            topic=topic, queue=queue)
        decided = await self._history(topic, queue, segs)
        return (await self._min_offset(decided[0]))[0] if decided else 0

    async def group_offsets(self, group: str, topic: str) -> list[dict[str, Any]]:
        """Per queue whose head is here: the group's committed offset (-1: never), the queue's max offset and the
        group's lag (the messages stored from its offset on: lag.py; null when it never committed). ``unavailable``:
        the ranges whose holders did not answer, counted as nothing."""
        stats = await self.queue_stats(topic)
        committed = await asyncio.gather(*(self.read_offset(group, topic, s["queue"], False) for s in stats),
                                         return_exceptions=True)
        for c in committed:
            if isinstance(c, BaseException) and not isinstance(c, ApiError):
                raise c
        # A queue being remapped (or whose older broker does not answer) is left out: its lag is unknown for now.
        out = []
        for s, o in zip(stats, committed):
            if isinstance(o, BaseException):
                continue
            row = {"queue": s["queue"], "offset": o, "max_offset": s["max_offset"], "lag": None}
            if o >= 0:
                ends, gaps = await self._stored_ends(await self._chain(topic, s["queue"]), o)
                row["lag"] = lag.stored_after(ends, o)
                if gaps:
                    row["unavailable"] = gaps
            out.append(row)
        return out

    async def _stored_ends(self, decided: list[Segment], after: int
                           ) -> tuple[list[tuple[Segment, int | None]], list[dict[str, Any]]]:
        """Each segment of ``decided`` that ends past ``after``, with the logic end of what it stores, and the
        ranges of those whose holders did not answer (their end None)."""
        ends, gaps = [], []
        for seg in decided:
            if seg.logic_end is not None and seg.logic_end <= after:
                continue
            if not lag.ends_at_budget(seg):
                try:
                    ends.append((seg, await self._max_offset(seg)))
                except ApiError:
                    ends.append((seg, None))
                    gaps.append({"broker": seg.broker, "from": seg.logic_start, "to": seg.logic_end})
                continue
            end = None
            pq = self.writer.local_queue(seg)
            if pq is not None and (seg.sealer or seg.broker) == self.me:
                end = seg.logic(pq.max_offset)
            for holder in ([] if end is not None else self._holders(seg)):
                try:
                    end = seg.logic((await self.peers.get(holder, _physical_path(seg, offset=0, max=0)))["max_offset"])
                    break
                except ApiError:
                    continue
            if end is None:
                gaps.append({"broker": seg.broker, "from": seg.logic_start, "to": seg.logic_end})
            ends.append((seg, None if end is None else min(end, seg.logic_end)))
        return ends, gaps

    async def offset_for_time(self, topic: str, queue: int, ts_ms: int) -> int:
        """The first logic offset stored at or after ``ts_ms`` (max_offset when none), across the queue's segments."""
        decided = await self._chain(topic, queue)
        for seg in decided:
            if seg.broker == self.me:
                pq = self.writer.local_queue(seg)
                found, end = ((await self._threads.run(pq.offset_for_time, ts_ms), pq.max_offset) if pq
                              else (seg.physical_start,) * 2)
            else:
                body = await self.peers.get(seg, _physical_path(seg, offset=0, max=0, ts=ts_ms))
                found, end = body["offset_for_time"], body["max_offset"]
            if found < end:
                return seg.logic(found)
        return await self._max_offset(decided[-1])

    async def queue_stats(self, topic: str, count: bool = False) -> list[dict[str, Any]]:
        """Logic min and max of the queues whose head this broker holds, over their whole history; ``count``: and
        the messages each stores from its min on (lag.py: offsets skipped after a lapsed session hold none; a
        segment whose holders do not answer counts as none)."""
        route = self.routes.routes.get(topic)
        if route is None:
            raise rejection(404, "TOPIC_NOT_FOUND", f"topic {topic!r} is unknown to this broker", topic=topic)
        out = []
        for q in route["queues"]:
            segs = self.routes.segments(topic, q["queue"]) or []
            if not segs or segs[-1].broker != self.me or all(s.logic_start is None for s in segs):
                continue
            decided = await self._chain(topic, q["queue"])
            row = {"queue": q["queue"], "min_offset": (await self._min_offset(decided[0]))[0],
                   "max_offset": await self._max_offset(decided[-1])}
            if count:
                ends, _ = await self._stored_ends(decided, row["min_offset"])
                row["messages"] = lag.stored_after(ends, row["min_offset"])
            out.append(row)
        return out
