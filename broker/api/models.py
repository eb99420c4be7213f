"""The shapes of the broker API's bodies, defined once: handlers check request bodies with them, and the broker's
/v1/openapi.json is generated from them (broker/api/openapi.py). The handlers' own parsers (broker/codec.py for
messages, broker/pop/params.py for pop) then read the checked bodies; tests/test_openapi_live.py holds live answers
to the spec. Answers may grow fields (API.md: add, never rename), so only their known fields are listed."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, with_config
from typing_extensions import NotRequired, TypedDict

from wire.shapes import OPEN, STRICT

from ..replication.offsets import COMMITS_PER_PUSH_MAX
from ..replication.pop_copies import LINES_PER_PUSH_MAX
from ..replication.producer_handover import QUEUES_PER_ASK_MAX
from ..replication.source import COPIES_PER_FETCH_MAX
from ..writes import MESSAGES_PER_SEND_MAX
from ..pop.limits import (DLQ_READ_MAX, HANDLES_PER_ACK_MAX, INVISIBLE_MS_MAX, INVISIBLE_MS_MIN, POP_MESSAGES_MAX,
                          WAIT_MS_MAX)

Name = Annotated[str, StringConstraints(min_length=1, max_length=255)]
Offset = Annotated[int, Field(ge=0, le=2**62)]
InvisibleMs = Annotated[int, Field(ge=INVISIBLE_MS_MIN, le=INVISIBLE_MS_MAX)]
assert DLQ_READ_MAX > 0   # the query bound; named here so the spec and the parser share pop/limits.py


# -- requests --------------------------------------------------------------------------------------------------
@with_config(STRICT)
class TextMessage(TypedDict):
    body: str
    key: NotRequired[str | None]
    props: NotRequired[dict[str, str] | None]


@with_config(STRICT)
class BinaryMessage(TypedDict):
    body_b64: str
    key: NotRequired[str | None]
    props: NotRequired[dict[str, str] | None]


Message = TextMessage | BinaryMessage   # exactly one of body and body_b64


@with_config(STRICT)
class Send(TypedDict):
    messages: Annotated[list[Message], Field(min_length=1, max_length=MESSAGES_PER_SEND_MAX)]


@with_config(STRICT)
class CopyOffset(TypedDict):
    pq: Name
    offset: Annotated[int, Field(ge=0, le=2**62)]


@with_config(STRICT)
class ReplicaFetch(TypedDict):
    follower: Name
    epoch: Annotated[int, Field(ge=0, le=2**62)]   # the follower's registration with meta
    queues: Annotated[list[CopyOffset], Field(max_length=COPIES_PER_FETCH_MAX)]


@with_config(STRICT)
class ReplicatedCommit(TypedDict):
    group: Name
    offset: Annotated[int, Field(ge=-1, le=2**62)]
    gen: Annotated[int, Field(ge=0, le=2**62)]
    seq: Annotated[int, Field(ge=0, le=2**63 - 1)]


@with_config(STRICT)
class ReplicaOffsets(TypedDict):
    topic: Name
    queue: Annotated[int, Field(ge=0, le=2**62)]
    leader_gen: Annotated[int, Field(ge=0, le=2**62)]   # of the head the pushing leader leads
    commits: Annotated[list[ReplicatedCommit], Field(min_length=1, max_length=COMMITS_PER_PUSH_MAX)]


@with_config(OPEN)
class ReplicaOffsetTable(TypedDict):
    commits: list[ReplicatedCommit]   # at most replication/offsets.py TABLE_PAGE_MAX, in group order
    next: str | None                  # the last group of this page when more follow (ask again with ?after=)
    holds: list[str]                  # the segments (physical queues) whose commits this disk holds


@with_config(STRICT)
class ProducersAsked(TypedDict):
    topic: Name
    queue: Annotated[int, Field(ge=0, le=2**62)]
    gen: Annotated[int, Field(ge=0, le=2**62)]   # of the head: the batches of older gens are asked
    previous: Annotated[str, StringConstraints(min_length=1, max_length=1024)]   # the physical queue of the segment
                                                                                # the head continues


@with_config(STRICT)
class ReplicaProducersAsk(TypedDict):
    queues: Annotated[list[ProducersAsked], Field(min_length=1, max_length=QUEUES_PER_ASK_MAX)]
    route_version: Annotated[int, Field(ge=0, le=2**62)]   # the asker's: the holder answers on at least those routes


@with_config(OPEN)
class ProducersHeld(TypedDict):
    topic: str
    queue: int
    batches: list[list[int]]   # [producer, seq, first, count, gen]


@with_config(OPEN)
class ReplicaProducers(TypedDict):
    queues: list[ProducersHeld]   # only the queues whose previous segment this broker holds to its end


@with_config(STRICT)
class ReplicaPop(TypedDict):
    topic: Name
    queue: Annotated[int, Field(ge=0, le=2**62)]
    leader_gen: Annotated[int, Field(ge=0, le=2**62)]   # of the head the pushing leader leads
    reset: bool                                         # a snapshot: it replaces what the copy holds of the queue
    lines: Annotated[list[list[Any]], Field(max_length=LINES_PER_PUSH_MAX)]   # pop journal lines (broker/pop/state.py)


@with_config(OPEN)
class ReplicaStored(TypedDict):
    stored: int


@with_config(STRICT)
class Commit(TypedDict):
    offset: Annotated[int, Field(ge=-1, le=2**62)]
    token: NotRequired[Annotated[int, Field(ge=0, le=2**62)] | None]


@with_config(STRICT)
class Pop(TypedDict):
    group: Name
    max: NotRequired[Annotated[int, Field(ge=1, le=POP_MESSAGES_MAX)] | None]
    invisible_ms: NotRequired[InvisibleMs | None]
    queue: NotRequired[Annotated[int, Field(ge=0, le=2**31)] | None]
    order: NotRequired[bool]
    wait_ms: NotRequired[Annotated[int, Field(ge=0, le=WAIT_MS_MAX)] | None]


@with_config(STRICT)
class Ack(TypedDict):
    group: Name
    handles: Annotated[list[Any], Field(min_length=1, max_length=HANDLES_PER_ACK_MAX)]


@with_config(STRICT)
class ChangeInvisible(TypedDict):
    group: Name
    handle: Any
    invisible_ms: InvisibleMs


@with_config(STRICT)
class Adopt(TypedDict):
    # [offset, attempt] (due now) or [offset, attempt, deadline_ms]
    deliveries: Annotated[list[Annotated[list[Offset], Field(min_length=2, max_length=3)]],
                          Field(max_length=100_000)]


# -- answers ---------------------------------------------------------------------------------------------------
@with_config(OPEN)
class Sent(TypedDict):
    queue: int
    offsets: list[int]


@with_config(OPEN)
class StoredMessage(TypedDict):
    offset: int
    ts: int
    key: str | None
    props: dict[str, str]
    body: NotRequired[str]
    body_b64: NotRequired[str]


@with_config(OPEN)
class Pulled(TypedDict):
    messages: list[StoredMessage]
    next_offset: int
    min_offset: int
    max_offset: int


@with_config(OPEN)
class PullFields(TypedDict):
    """The ``X-Pull`` header of a binary pull's answer (compact JSON): every field of the JSON answer but
    ``messages``, which the body carries as a STORED batch."""
    next_offset: int
    min_offset: int
    max_offset: int
    unavailable: NotRequired[list[dict[str, Any]]]
    held_by: NotRequired[dict[str, Any]]


@with_config(OPEN)
class CommittedOffset(TypedDict):
    offset: int
    gen: NotRequired[int]   # with local=1: the gen of the head segment it was committed on (-1: never)
    holds: NotRequired[list[str]]   # with local=1: the segments (physical queues) whose commits this disk holds


@with_config(OPEN)
class GroupQueueOffset(TypedDict):
    queue: int
    offset: int
    max_offset: int


@with_config(OPEN)
class GroupOffsets(TypedDict):
    queues: list[GroupQueueOffset]


@with_config(OPEN)
class CommittedGroup(TypedDict):
    group: str
    topics: list[str]


@with_config(OPEN)
class CommittedGroups(TypedDict):
    groups: list[CommittedGroup]
    truncated: bool


@with_config(OPEN)
class QueueRange(TypedDict):
    queue: int
    min_offset: int
    max_offset: int
    messages: NotRequired[int]   # with ?count=1: the messages stored from min_offset on (offsets skipped hold none)


@with_config(OPEN)
class QueueRanges(TypedDict):
    queues: list[QueueRange]


@with_config(OPEN)
class LastHour(TypedDict):
    topic: str
    minute_ms: int          # the start of the minute now running, the last of the buckets
    stored: list[int]       # messages stored (sends this broker led) per minute, oldest first, 60 of them
    served: list[int]       # messages served to pulls per minute


@with_config(OPEN)
class OffsetForTime(TypedDict):
    queue: int
    offset: int


@with_config(OPEN)
class PhysicalRecord(TypedDict):
    """A stored record, byte-exact: a message stored as JSON under "payload", one stored as a binary batch record
    (docs/batch-format.md) base64-encoded under "payload_b64"."""
    offset: int
    ts: int
    payload: NotRequired[dict[str, Any]]
    payload_b64: NotRequired[str]


@with_config(OPEN)
class PhysicalRead(TypedDict):
    records: list[PhysicalRecord]
    min_offset: int
    max_offset: int


@with_config(OPEN)
class PoppedMessage(TypedDict):
    queue: int
    offset: int
    handle: str
    attempt: int
    key: str | None
    props: dict[str, str]
    body: NotRequired[str]
    body_b64: NotRequired[str]


@with_config(OPEN)
class Popped(TypedDict):
    messages: list[PoppedMessage]


@with_config(OPEN)
class AckResult(TypedDict):
    handle: str | None
    ok: bool
    code: NotRequired[str]


@with_config(OPEN)
class Acked(TypedDict):
    results: list[AckResult]


@with_config(OPEN)
class NewHandle(TypedDict):
    handle: str


@with_config(OPEN)
class DeadLetter(TypedDict):
    offset: int
    topic: str
    queue: int
    origin_offset: int
    attempts: int


@with_config(OPEN)
class DeadLetters(TypedDict):
    messages: list[DeadLetter]
    next_offset: int


@with_config(OPEN)
class PopQueueStats(TypedDict):
    group: str
    topic: str
    queue: int
    pop_offset: int
    in_flight: int
    invisible: int
    revive_backlog: int
    frozen: bool
    gen: int


@with_config(OPEN)
class PopStats(TypedDict):
    group: str
    broker: str
    queues: list[PopQueueStats]
    dlq_messages: int


@with_config(OPEN)
class Handover(TypedDict):
    found: bool
    gen: NotRequired[int]
    next_offset: NotRequired[int]
    in_flight: NotRequired[int]
    holds: list[str]   # the queue's segments this disk held as their leader or an in-sync copy


@with_config(OPEN)
class TakeoverQueued(TypedDict):
    queued: bool


@with_config(OPEN)
class Adopted(TypedDict):
    adopted: int


@with_config(OPEN)
class Health(TypedDict):
    status: Literal["ok"]
    broker: str


@with_config(OPEN)
class Ready(TypedDict):
    ready: bool
    state: str
    epoch: int | None
    route_version: int
