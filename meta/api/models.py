"""The shapes of the meta API's bodies, defined once: handlers validate request bodies with them, and
/v1/openapi.json is generated from them (meta/api/openapi.py), so the spec cannot drift from what is checked.

Request bodies are validated strictly (no coercion: "1" is not 1, true is not 1) and refuse unknown fields by name;
the state machine's own validation (meta/commands.py) runs again inside apply, because a command may reach the log
without passing through HTTP. Response shapes are checked against live answers by tests/test_openapi_live.py.
Responses may grow fields (API.md: add, never rename), so only their known fields are listed and typed.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, with_config
from typing_extensions import NotRequired, TypedDict

from wire import route as route_model
from wire.shapes import OPEN, STRICT

from .. import limits

from ..raft import membership as raft_membership
from ..commands import GROUP_CONFIG_INTS

Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]+$", min_length=1, max_length=127)]
Version = Annotated[int, Field(ge=0, le=2**62)]
Epoch = Annotated[int, Field(ge=1, le=2**62)]
Queue = Annotated[int, Field(ge=0, le=limits.QUEUES_PER_TOPIC_MAX - 1)]
ConfigValue = Annotated[str, StringConstraints(max_length=limits.CONFIG_VALUE_CHARS_MAX)]
ConfigKey = Annotated[str, StringConstraints(min_length=1, max_length=limits.CONFIG_KEY_CHARS_MAX)]


def _bounded(setting: str) -> Any:
    lo, hi = GROUP_CONFIG_INTS[setting]
    return Annotated[int, Field(ge=lo, le=hi)]


TopicConfig = Annotated[dict[ConfigKey, ConfigValue | None],
                        Field(max_length=limits.CONFIG_KEYS_MAX, title="TopicConfig")]   # the title names it in the spec


# -- requests --------------------------------------------------------------------------------------------------
@with_config(STRICT)
class RegisterBroker(TypedDict):
    address: Annotated[str, StringConstraints(pattern=r"^[\x21-\x7e]+$", max_length=limits.ADDRESS_CHARS_MAX)]
    zone: NotRequired[Annotated[str, StringConstraints(max_length=64)] | None]
    cluster: NotRequired[Name | None]   # RocketMQ's brokerClusterName; none: limits.CLUSTER_DEFAULT
    # Its data directory's id (wire/disk_identity.py): the one it had, it kept its copies; another (or none), it
    # lost them. Stator's brokers always name it.
    disk: NotRequired[Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")] | None]


@with_config(STRICT)
class HeldCopy(TypedDict):
    topic: Name
    queue: Queue
    gen: Version
    end: Version   # the physical end this broker holds of it


@with_config(STRICT)
class CopiesHeld(TypedDict):
    epoch: Epoch
    copies: Annotated[list[HeldCopy], Field(min_length=1, max_length=limits.SEALS_PER_REPORT_MAX)]


@with_config(STRICT)
class DrainBroker(TypedDict):
    draining: bool   # false stops a drain (what moved stays moved)
    to: NotRequired[Annotated[list[Name], Field(min_length=1, max_length=limits.BROKERS_MAX)] | None]


@with_config(STRICT)
class BrokerHeartbeat(TypedDict):
    epoch: Epoch
    queues: NotRequired[Annotated[dict[str, Annotated[int, Field(ge=0)]],
                                  Field(max_length=limits.HEARTBEAT_QUEUES_MAX)]]


@with_config(STRICT)
class PeerDown(TypedDict):
    epoch: Epoch
    peer: Name


@with_config(STRICT)
class SealReport(TypedDict):
    topic: Name
    queue: Queue
    gen: Version
    end_offset: Version
    physical_queue: NotRequired[Annotated[str, StringConstraints(max_length=300)] | None]


@with_config(STRICT)
class Seal(SealReport):
    epoch: Epoch


@with_config(STRICT)
class Seals(TypedDict):
    epoch: Epoch
    seals: Annotated[list[SealReport], Field(min_length=1, max_length=limits.SEALS_PER_REPORT_MAX)]


@with_config(STRICT)
class CreateTopic(TypedDict):
    topic: Name
    queues: Annotated[int, Field(ge=1, le=limits.QUEUES_PER_TOPIC_MAX)]
    brokers: NotRequired[Annotated[list[Name], Field(min_length=1, max_length=limits.BROKERS_MAX)] | None]
    slots: NotRequired[Annotated[int, Field(ge=1, le=limits.SLOTS_PER_TOPIC_MAX)]]
    order: NotRequired[Literal["best_tried", "strict"]]
    config: NotRequired[TopicConfig]
    replicas: NotRequired[Annotated[int, Field(ge=1, le=limits.REPLICAS_MAX)] | None]
    min_insync: NotRequired[Annotated[int, Field(ge=1, le=limits.REPLICAS_MAX)] | None]
    # "global" (the default: any broker), or the clusters the queues and their copies stay in
    scope: NotRequired[Literal["global"] | Annotated[list[Name], Field(min_length=1,
                                                                       max_length=limits.SCOPE_CLUSTERS_MAX)] | None]


@with_config(STRICT)
class InSyncChange(TypedDict):
    topic: Name
    queue: Queue
    gen: Annotated[int, Field(ge=0, le=2**62)]
    in_sync: Annotated[list[Name], Field(min_length=1, max_length=limits.REPLICAS_MAX)]
    # The registration epoch of each follower the leader heard from (Kafka's KIP-903): one it adds must be in its
    # current registration, not one that registered again since (a new disk) while the request was on its way
    epochs: dict[Name, Epoch]


@with_config(STRICT)
class AlterInSync(TypedDict):
    epoch: Epoch
    changes: Annotated[list[InSyncChange], Field(min_length=1, max_length=limits.IN_SYNC_CHANGES_MAX)]


@with_config(STRICT)
class GrowTopic(TypedDict):
    queues: Annotated[int, Field(ge=1, le=limits.QUEUES_PER_TOPIC_MAX)]


@with_config(STRICT)
class Remap(TypedDict):
    brokers: Annotated[list[Name], Field(min_length=1, max_length=limits.BROKERS_MAX)]
    queues: NotRequired[Annotated[list[Queue], Field(min_length=1, max_length=limits.QUEUES_PER_TOPIC_MAX)] | None]


@with_config(STRICT)
class Elect(TypedDict):
    queues: NotRequired[Annotated[list[Queue], Field(min_length=1, max_length=limits.QUEUES_PER_TOPIC_MAX)] | None]
    unclean: NotRequired[bool]


@with_config(OPEN)
class Elected(TypedDict):
    topic: str
    queues: list[dict[str, Any]]
    version: int


@with_config(STRICT)
class LockRef(TypedDict):
    topic: Name
    queue: Queue
    token: Epoch


@with_config(STRICT)
class GroupHeartbeat(TypedDict):
    member: Name
    topics: Annotated[list[Name], Field(min_length=1, max_length=limits.GROUP_TOPICS_MAX)]
    mode: Literal["exclusive", "shared"]
    released: NotRequired[Annotated[list[LockRef], Field(max_length=limits.RELEASES_PER_HEARTBEAT_MAX)] | None]


@with_config(STRICT)
class LeaveGroup(TypedDict):
    member: Name


@with_config(STRICT)
class GroupConfig(TypedDict, total=False):
    lease_ms: _bounded("lease_ms") | None
    heartbeat_interval_ms: _bounded("heartbeat_interval_ms") | None
    max_attempts: _bounded("max_attempts") | None
    retry_topic: Name | None
    mode: Literal["exclusive", "shared"] | None


@with_config(STRICT)
class AddMember(TypedDict):
    """A meta node to add as a learner (meta/raft/roles.py): its name (the config's rule), and where the others
    reach it."""
    node: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]+$", min_length=1,
                                           max_length=raft_membership.NAME_CHARS_MAX)]
    raft: Annotated[str, StringConstraints(pattern=r"^[\x21-\x7e]+:[0-9]{1,5}$",
                                           max_length=raft_membership.RAFT_ADDRESS_CHARS_MAX)]
    url: Annotated[str, StringConstraints(pattern=r"^https?://[\x21-\x7e]+$",
                                          max_length=raft_membership.URL_CHARS_MAX)]


# -- responses -------------------------------------------------------------------------------------------------
@with_config(OPEN)
class WriteResult(TypedDict):
    """A command's outcome: the version it made, plus what the command reports (a topic, a group's locks...)."""
    version: int


@with_config(OPEN)
class Member(TypedDict):
    node: str
    raft: str
    url: str
    disk: str | None     # the disk id the membership in this node's log records for it (None: not heard from yet)
    voter: bool          # False: a learner (added and not promoted yet)


@with_config(OPEN)
class Cluster(TypedDict):
    node: str
    role: str
    leader: str | None
    term: int
    commit_index: int
    applied_index: int            # the raft entries applied here: compare with commit_index, not applied_version
    applied_version: int
    disk: str                     # this node's data directory id (wire/disk_identity.py)
    voter: bool                   # False: a learner, catching up before it is promoted (meta/raft/membership.py)
    membership_index: int | None  # the log index of the membership in force on this node
    members: list[Member]


@with_config(OPEN)
class ClusterMembers(TypedDict):
    membership_index: NotRequired[int | None]   # in the list's answer: the log index of the membership in force
    members: list[Member]


@with_config(OPEN)
class Broker(TypedDict):
    broker: str
    address: str
    zone: str | None
    cluster: str
    draining: bool              # its head copies move off it (stator broker drain); no new copy is placed on it
    drain_to: list[str] | None  # the brokers they go to first (stator broker replace)
    epoch: int
    state: Literal["active", "fenced"]
    last_heartbeat_ms: int | None
    heads: NotRequired[int]    # with ?include=heads: the logic queues whose head segment it holds


@with_config(OPEN)
class BrokerDetail(Broker):
    holding: int          # heads it holds a copy of, leader or not: what a drain still moves
    sealed_copies: int    # older segments it holds a copy of: read there, left by a drain


@with_config(OPEN)
class Brokers(TypedDict):
    brokers: list[Broker]


@with_config(OPEN)
class TopicSummary(TypedDict):
    topic: str
    queues: int
    version: int


@with_config(OPEN)
class Topics(TypedDict):
    topics: list[TopicSummary]


@with_config(OPEN)
class StoredSegment(TypedDict):
    gen: int
    broker: str
    physical_queue: str
    physical_start: int
    logic_start: int | None
    logic_end: int | None
    state: Literal["active", "sealing", "sealed"]
    budget_end: int
    replicas: list[str]
    in_sync: list[str]
    sealer: str
    # "broker" (its end reported), "session_expired" or "disk_lost" (sealed at its budget), None: not yet
    sealed_by: str | None


@with_config(OPEN)
class LogicQueue(TypedDict):
    queue: int
    slot_ranges: list[list[int]]
    segments: list[StoredSegment]


@with_config(OPEN)
class TopicDetail(TypedDict):
    topic: str
    queues: int
    slots: int
    order: Literal["best_tried", "strict"]
    version: int
    incarnation: int
    created_ms: int
    config: dict[str, str]
    replicas: int
    min_insync: int
    scope: list[str] | Literal["global"]
    logic_queues: list[LogicQueue]


@with_config(OPEN)
class QueueSegments(TypedDict):
    topic: str
    queue: int
    version: int
    segments: list[route_model.SegmentJson]


@with_config(OPEN)
class Event(TypedDict):
    """A stored event: its type's own fields come beside these (API.md, events)."""
    version: int
    ts: int
    type: str


@with_config(OPEN)
class History(TypedDict):
    events: list[Event]
    next_after: int


@with_config(OPEN)
class ImageDigest(TypedDict):
    node: str
    version: int
    commands: int
    sha256: str
    bytes: int


@with_config(OPEN)
class GroupSummary(TypedDict):
    group: str
    mode: str | None
    members: int
    locks: int
    version: int
    source: NotRequired[Literal["meta", "brokers"]]   # with ?include=brokers: who knows the group


@with_config(OPEN)
class Groups(TypedDict):
    groups: list[GroupSummary]


@with_config(OPEN)
class GroupMember(TypedDict):
    member: str
    topics: list[str]
    mode: str
    joined_ms: int
    lease_expires_ms: int | None


@with_config(OPEN)
class Assignment(TypedDict):
    topic: str
    queue: int
    member: str
    token: int
    state: Literal["owned", "revoking"]
    target: str | None
    granted_ms: int
    lease_expires_ms: int | None
    committed_offset: int | None
    max_offset: int | None
    lag: int | None


@with_config(OPEN)
class GroupOffset(TypedDict):
    topic: str
    queue: int
    committed_offset: int | None
    max_offset: int | None
    lag: int | None                      # messages stored from the committed offset on (a skipped budget is none)
    unavailable: NotRequired[list[dict[str, Any]]]   # ranges whose holders did not answer, left out of lag


@with_config(OPEN)
class PopPosition(TypedDict):
    topic: str
    queue: int
    broker: str
    pop_offset: int                      # the next offset a pop takes
    in_flight: int                       # popped, neither acked nor past their invisible time
    revive_backlog: int                  # past their invisible time, waiting to be delivered again


@with_config(OPEN)
class GroupDetail(TypedDict):
    group: str
    mode: str | None
    config: dict[str, Any]
    version: int
    members: list[GroupMember]
    assignments: list[Assignment]
    source: Literal["meta", "brokers"]   # "brokers": a pull group meta has no record of, known by its offsets
    offsets: list[GroupOffset]           # every queue the group committed on, assigned or not
    pop: list[PopPosition]               # every queue the group pops from, on the broker that serves it


@with_config(OPEN)
class Health(TypedDict):
    status: str
    node: str


@with_config(OPEN)
class Ready(TypedDict):
    ready: bool
    role: str
    applied_version: int
    projection_position: int
    projection_gap_versions: int
    projection_complete: bool


@with_config(OPEN)
class BrokerHeartbeatAnswer(TypedDict):
    state: Literal["active", "fenced"]
    version: int
    budgets: dict[str, int]
    budget_grant: int
    heartbeat_interval_ms: int
    session_timeout_ms: int
    copies_version: int   # grows when a sealed copy is placed on the broker: it then asks for the list again


@with_config(OPEN)
class OwnedQueue(TypedDict):
    topic: str
    queue: int
    token: int
    lease_expires_ms: int


@with_config(OPEN)
class GroupHeartbeatAnswer(TypedDict):
    assignments: list[OwnedQueue]
    revoking: list[dict[str, Any]]
    heartbeat_interval_ms: int
    lease_ms: int
    config: dict[str, Any]
    version: int


@with_config(OPEN)
class SealResults(TypedDict):
    results: list[dict[str, Any]]
    version: int


@with_config(OPEN)
class SealedCopies(TypedDict):
    version: int
    copies: list[dict[str, Any]]
    addresses: dict[str, str]
    next: str | None


@with_config(OPEN)
class PeerDownAnswer(TypedDict):
    peer: str
    probe: Literal["refused", "answered", "silent"] | None
    state: Literal["active", "fenced"]


@with_config(OPEN)
class InSyncResults(TypedDict):
    results: list[dict[str, Any]]
    version: int


Route = with_config(OPEN)(route_model.RouteJson)
