"""The Stator Python client: admin calls, route subscriptions, a producer and a pull consumer (asyncio), plus blocking
wrappers for scripts (``client.sync``).

    async with AdminClient(meta_urls, admin_token) as admin:
        await admin.create_topic("orders", queues=8, order="strict")
    async with Producer(meta_urls, client_token, "orders") as producer:
        result = await producer.send("paid", key="order-17")
    async with PullConsumer(meta_urls, client_token, "orders", "billing") as consumer:
        for m in await consumer.poll(timeout_s=1.0):
            ...     # m.body is bytes (a str was sent as UTF-8); m.text decodes it
        await consumer.commit_positions()
    async with ExclusiveConsumer(meta_urls, client_token, "orders", "billing", handle) as consumer:
        await consumer.run()   # one owner per queue at a time, in order; until close() or a failure
    async with PopConsumer(meta_urls, client_token, "orders", "mailer", handle) as consumer:
        await consumer.run()   # shared: acked on success, extended while slow, nacked with backoff on failure

Producer and PullConsumer (and the ExclusiveConsumer over it) send and pull the binary batch (docs/batch-format.md)
by default; ``wire_format="json"`` makes them use JSON.
"""

from .admin import AdminClient
from .consumer import PullConsumer, PullResult, ReceivedMessage
from wire.errors import (Closed, Fenced, GroupNotFound, LocksCatchingUp, NoLeader, NotLeader, Sealing, StaleToken,
                     StatorError, TopicExists, TopicNotFound, Unavailable, VersionMismatch)
from .exclusive import ExclusiveConsumer
from .fault import LatencyFaultAvoidance, avoidance_ms
from wire.caller import Backoff, MetaCaller
from .pop import PopConsumer, PoppedMessage
from .producer import Producer, SendResult
from .routes import RouteSubscription
from .selection import (CallableSelector, KeySelector, Message, QueueSelector, RandomSelector, RoundRobinSelector,
                        as_selector)
from .slots import SlotTable, queue_for_key, queue_for_slot, slot_of
from wire.sse import SseEvent, SseParser
from .sync import SyncAdminClient, SyncExclusiveConsumer, SyncProducer, SyncPullConsumer

__all__ = [
    "AdminClient", "RouteSubscription", "Producer", "SendResult", "PullConsumer", "PullResult", "ReceivedMessage",
    "ExclusiveConsumer", "PopConsumer", "PoppedMessage",
    "Message", "QueueSelector", "KeySelector", "RoundRobinSelector", "RandomSelector", "CallableSelector",
    "as_selector", "LatencyFaultAvoidance", "avoidance_ms", "slot_of", "queue_for_slot", "queue_for_key", "SlotTable",
    "MetaCaller", "Backoff", "SseParser", "SseEvent",
    "StatorError", "Unavailable", "Closed", "NotLeader", "Sealing", "Fenced", "NoLeader", "VersionMismatch",
    "StaleToken", "LocksCatchingUp", "GroupNotFound", "TopicNotFound", "TopicExists",
    "SyncAdminClient", "SyncProducer", "SyncPullConsumer", "SyncExclusiveConsumer",
]
