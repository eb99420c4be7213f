"""Every bound of pop consumption on a broker, each with its unit last (DESIGN.md invariant 9)."""

POP_MESSAGES_MAX = 1_000            # "max" of one pop
POP_MESSAGES_DEFAULT = 32
INVISIBLE_MS_MIN = 1_000
INVISIBLE_MS_MAX = 12 * 3600 * 1000
INVISIBLE_MS_DEFAULT = 60_000
WAIT_MS_MAX = 30_000                # long-poll of one pop
HANDLES_PER_ACK_MAX = 1_000
HANDLE_CHARS_MAX = 1_024
IN_FLIGHT_PER_QUEUE_MAX = 20_000    # invisible messages of one (group, topic, queue)
IN_FLIGHT_MAX = 2_000_000           # invisible messages of every group on this broker
POP_QUEUES_MAX = 100_000            # (group, topic, queue) keys with pop state on this broker
POP_WAITERS_MAX = 1_000             # long-polling pops parked at once
# A pop that found nothing on the free queues waits this long at most for one that another pop holds, whatever its
# wait_ms (which is for new messages): the holder is done in milliseconds, and an empty answer while messages wait
# behind it would be wrong.
BUSY_QUEUE_WAIT_MS = 1_000
JOURNAL_WAITERS_MAX = 10_000        # acks and changes waiting for their fsync
JOURNAL_WAIT_S = 30.0               # a disk that stops answering fails the ack instead of hanging it
ACK_OUTCOMES_REMEMBERED_MAX = 100_000  # recent acks kept to tell a repeated ack from a superseded handle
DLQ_READ_MAX = 1_000
DLQ_TAIL_SCAN_MAX = 10_000          # DLQ records checked on restart for a dead letter half written

# A first delivery stays in memory this long before it is written: an ack within it cancels the pair (no write for
# either), as RocketMQ's buffer merge does. It must stay well under the shortest invisible time, so a delivery is
# always on disk before its deadline.
DELIVERY_WRITE_DELAY_MS = 400
FLUSH_TICK_MS = 20                  # the journal's round interval while deliveries wait to mature
COMPACT_AFTER_LINES = 50_000
DLQ_RETRY_MS = 1_000                # a dead letter whose message could not be read (peer down) is tried again after
HANDOVER_ASK_EVERY_MS = 200         # how often a new head asks an old one for the expired deliveries it kept
HANDOVER_PEERS_MAX = 16             # older heads asked for a logic queue's pop state

assert DELIVERY_WRITE_DELAY_MS * 2 <= INVISIBLE_MS_MIN
assert POP_MESSAGES_DEFAULT <= POP_MESSAGES_MAX <= IN_FLIGHT_PER_QUEUE_MAX <= IN_FLIGHT_MAX
assert INVISIBLE_MS_MIN <= INVISIBLE_MS_DEFAULT <= INVISIBLE_MS_MAX
