"""Every bound of the meta service in one place, each with its unit last (DESIGN.md invariant 9)."""

from wire import sse as _sse
from wire import headers as _headers
from wire.names import BROKER_NAME_CHARS_MAX

REQUEST_BODY_BYTES_MAX = 1 * 1024 * 1024
TOPIC_NAME_CHARS_MAX = 127
ADDRESS_CHARS_MAX = 256
# What one topic's route and one remap can carry on this design: at 16,384 queues every seal re-rendered a 7.6 MB
# route on each meta node, a whole-topic remap held the Raft tick for over a second (past the election timeout) and
# brokers were fenced in the storm (tests/test_max_topic.py at the old value). Route deltas lift this bound.
QUEUES_PER_TOPIC_MAX = 4_096
SLOTS_PER_TOPIC_MAX = 65_536
SLOTS_DEFAULT = 1024
TOPICS_MAX = 100_000
BROKERS_MAX = 1024
CONFIG_KEYS_MAX = 64
CONFIG_KEY_CHARS_MAX = 128
CONFIG_VALUE_CHARS_MAX = 1024
HEARTBEAT_QUEUES_MAX = 100_000
SEALS_PER_REPORT_MAX = 1_024     # seal reports one POST /v1/brokers/{b}/seals (one command) carries
# Replicas of a queue's head (DESIGN.md invariant 12). The defaults are the cluster config's (MetaConfig): copies
# capped at the active brokers (three where three brokers exist, one where one does), min_insync at copies - 1 (so one
# broker lost leaves a topic writable: two copies take writes on one, as Kafka's min.insync.replicas=1 for RF 2).
REPLICAS_MAX = 5
# Scopes (issue 37): a broker names its cluster (RocketMQ's brokerClusterName), a topic the clusters its queues and
# copies stay in, or "global" (any broker). A broker that names none is in CLUSTER_DEFAULT, as in RocketMQ.
CLUSTER_DEFAULT = "DefaultCluster"
SCOPE_GLOBAL = "global"
SCOPE_CLUSTERS_MAX = 16
# A drain (issue 37) moves a broker's heads off it a step at a time: each step one command, at most this many queues
DRAIN_QUEUES_PER_STEP_MAX = 1_000
REPLICAS_DEFAULT = 3
MIN_INSYNC_DEFAULT = 2
IN_SYNC_CHANGES_MAX = 10_000     # changes one POST /v1/brokers/{b}/in-sync (one command) carries

# Idempotency: outcomes of the last requests are kept in the image (replicated), bounded by count and age.
REQUEST_OUTCOMES_MAX = 100_000
REQUEST_OUTCOME_AGE_MS_MAX = 3_600_000
REQUEST_ID_CHARS_MAX = _headers.REQUEST_ID_CHARS_MAX  # checked at the edge (wire/headers.py)

# One command as stored in the log (JSON text of its envelope). A heartbeat's budget grants are the largest command:
# at most HEARTBEAT_QUEUES_MAX grants of well under 80 bytes each.
COMMAND_BYTES_MAX = 8 * 1024 * 1024

# History kept in the image for watch catch-up and projection rebuilds; older events live only in the projection.
# HISTORY_EVENTS_MAX is the default window; a node's config may set another (``history_window``) within these bounds.
# The leader stamps its window into every command envelope, so the window is decided in the log like the offset
# budget and every replica trims at the same entries (meta/state_machine.py).
HISTORY_EVENTS_MAX = 200_000
HISTORY_WINDOW_MIN = 10          # a smaller window trims on almost every event and keeps nothing for watch catch-up
HISTORY_WINDOW_MAX = 2_000_000   # events held in every replica's memory and in every snapshot
HISTORY_PAGE_MAX = 10_000
HISTORY_SCAN_EVENTS_MAX = 50_000  # events one /v1/history call may read past while filtering by topic

# A projection writer that failed to open (killed while it started, its database away) is opened again after this.
PROJECTION_OPEN_BACKOFF_S_MIN = 0.2
PROJECTION_OPEN_BACKOFF_S_MAX = 10.0
# Filling a projection's gap from peers (meta/projection_gap.py): events per page fetched and applied at once (a page
# is held in memory: a topic of a thousand queues is an event of ~130 KB), the bounded backoff between failed
# rounds, and the deadline of one page's call to the peers.
PROJECTION_FILL_PAGE_EVENTS = 1_000
# A history read older than the image waits this long for a node's projection to open after a start (migrations run
# first), then is refused HISTORY_UNAVAILABLE: a client asks another node.
PROJECTION_OPEN_WAIT_S = 10.0
PROJECTION_FILL_BACKOFF_S_MIN = 0.2
PROJECTION_FILL_BACKOFF_S_MAX = 30.0
PROJECTION_FILL_CALL_S_MAX = 30.0
# Events the window trimmed that a node keeps in memory (not replicated) until its own projection has them: the
# projection may fall this far behind the image's window (a slow start, a database away) before it needs its peers.
# Pruned as the projection applies, so it holds nearly nothing while the projection keeps up; at most one more
# window's worth of memory while it does not.
HISTORY_TRIMMED_KEPT_EVENTS_MAX = 200_000

# Offset budget: how far a broker may write into a segment before meta renews it (DESIGN.md invariant 5).
# The leader stamps its configured grant into every command envelope (apply reads nothing from a node's own config).
OFFSET_BUDGET_DEFAULT = 1_000_000
OFFSET_BUDGET_MAX = 2**40

# Broker sessions (KRaft's defaults).
BROKER_HEARTBEAT_INTERVAL_MS = 2_000
BROKER_SESSION_TIMEOUT_MS = 9_000

# Waits.
READ_WAIT_S_DEFAULT = 5.0
READ_WAIT_S_MAX = 60.0
LONG_POLL_WAIT_S_MAX = 300.0
PROPOSE_TIMEOUT_S = 5.0
FORWARD_TIMEOUT_S = 10.0
LONG_POLL_WAITERS_MAX = 20_000
WATCH_STREAMS_MAX = 20_000
VERSION_WAITERS_MAX = 20_000   # reads waiting for ?min_version (each holds a request and a timer)
WATCH_TOPICS_PER_STREAM_MAX = 1_000
# A node without a leader this long (elections take well under a second), or this far behind its leader's commit
# index, ends its watch streams so that brokers and clients move to a node that follows the log.
WATCH_LEADERLESS_S_MAX = 2.0
WATCH_LAG_ENTRIES_MAX = 10_000

# A route carries the newest segments of each queue, so its size never grows with the history: a 1,000-queue topic
# remapped twice once passed the brokers' line bound and blinded every broker. Older segments are served by
# GET /v1/topics/{topic}/queues/{queue}/segments. Bytes below are generous upper bounds of the JSON (names and
# addresses are ASCII; numbers at most 19 digits), so that the largest route the limits allow fits the SSE parser.
ROUTE_SEGMENTS_PER_QUEUE_MAX = 3   # the head, the one it continues (maybe sealing) and one more
_NAME_BYTES = max(TOPIC_NAME_CHARS_MAX, BROKER_NAME_CHARS_MAX) + 64   # a physical queue name: topic + suffix
_REPLICA_NAMES_BYTES_MAX = 40 + 2 * REPLICAS_MAX * (BROKER_NAME_CHARS_MAX + 3)   # replicas and in_sync
_ROUTE_SEGMENT_BYTES_MAX = (200 + 2 * BROKER_NAME_CHARS_MAX + ADDRESS_CHARS_MAX + _NAME_BYTES + 6 * 20
                            + _REPLICA_NAMES_BYTES_MAX)
_ROUTE_QUEUE_BYTES_MAX = (150 + BROKER_NAME_CHARS_MAX + ADDRESS_CHARS_MAX + _NAME_BYTES + 3 * 20
                          + _REPLICA_NAMES_BYTES_MAX
                          + ROUTE_SEGMENTS_PER_QUEUE_MAX * _ROUTE_SEGMENT_BYTES_MAX)
ROUTE_BYTES_MAX = (QUEUES_PER_TOPIC_MAX * (_ROUTE_QUEUE_BYTES_MAX + 3 * 20 + 80)   # queue, slot range, barrier
                   + CONFIG_KEYS_MAX * 6 * (CONFIG_KEY_CHARS_MAX + CONFIG_VALUE_CHARS_MAX) + 64 * 1024
                   + BROKERS_MAX * (BROKER_NAME_CHARS_MAX + ADDRESS_CHARS_MAX + 8)    # the replicas' addresses
                   + SCOPE_CLUSTERS_MAX * (BROKER_NAME_CHARS_MAX + 3))                # the scope's clusters
assert ROUTE_BYTES_MAX <= _sse.LINE_BYTES_MAX, (ROUTE_BYTES_MAX, _sse.LINE_BYTES_MAX)

# Rendered routes kept per node (least recently used evicted first): a 1,000-queue route is ~340 KB.
ROUTE_CACHE_BYTES_MAX = 128 * 1024 * 1024
# The same routes gzip'd for readers that accept it, kept apart: a 1,000-queue route is ~17 KB gzip'd, so this holds
# ~15,000 of them (15 million queues) where the rendered cache holds ~400. Smaller routes are sent as they are.
ROUTE_GZIP_CACHE_BYTES_MAX = 256 * 1024 * 1024
ROUTE_GZIP_MIN_BYTES = 16 * 1024
ROUTE_GZIP_LEVEL = 1          # 18x smaller for ~0.7 ms per 320 KB; level 6 saves a little more for 4x the CPU
# Routes of topics this big are rendered in a worker thread and kept rendered and gzip'd as they change
# (meta/route_warmer.py): rendering a 1,000-queue route takes ~9 ms, which a reader should not wait for.
ROUTE_RENDER_OFFLOAD_QUEUES_MIN = 64
# A warm pass starts once topics stopped changing for ROUTE_WARM_QUIET_S, or ROUTE_WARM_DELAY_MAX_S after the first
# change it covers: renders compete with writes for the GIL (rendering during a burst of a thousand topic creations
# made each creation 2.4x slower), and a topic that keeps changing is rendered at most once per delay.
ROUTE_WARM_QUIET_S = 0.25
ROUTE_WARM_DELAY_MAX_S = 5.0
# Once warm, the renders of changed routes take at most this share of the wall time (after each render the warmer
# waits out the rest): a thousand 1,000-queue routes rendered back to back on each node starved the raft tick
# threads of the GIL past the election timeout (4 term changes in a scale run, none with the renders held back; at
# full speed, 3 to 4 elections while a million queues were created). The warm-up of a starting node runs at full speed.
ROUTE_WARM_DUTY = 0.25
# A starting node says it is ready once its routes are warm (meta/route_warmer.py), or this long after it caught up
# with the leader, whichever comes first: ~5 s of warm-up at a million queues here, ~80 s at ten million, where a
# restart must be ready within 60 s (ops/bench/scale.py).
ROUTE_WARM_READY_WAIT_MAX_S = 20.0

# Consumer groups (exclusive locks and shared members). A group's lock table goes to brokers as one watch event, so
# its size is bounded by the topics a member may name times the queues of a topic.
GROUP_NAME_CHARS_MAX = 128
MEMBER_NAME_CHARS_MAX = 128
GROUPS_MAX = 10_000
MEMBERS_PER_GROUP_MAX = 1_000
MEMBERS_MAX = 100_000
GROUP_TOPICS_MAX = 32              # topics one member may subscribe to
RELEASES_PER_HEARTBEAT_MAX = 4_096
EXPIRIES_PER_COMMAND_MAX = 1_000   # members or locks one expiry command names
# Group settings (PUT /v1/groups/{group}/config): defaults and bounds. A lease outlives several heartbeats.
LEASE_MS_DEFAULT = 15_000
LEASE_MS_MIN = 1_000
LEASE_MS_MAX = 600_000
GROUP_HEARTBEAT_INTERVAL_MS_DEFAULT = 3_000
GROUP_HEARTBEAT_INTERVAL_MS_MIN = 100
GROUP_HEARTBEAT_INTERVAL_MS_MAX = 60_000
MAX_ATTEMPTS_DEFAULT = 16
MAX_ATTEMPTS_MAX = 1_000
