"""Physical queue storage: append-only segment files of frames of records, by physical offset. Pure storage, no HTTP.

    store = QueueStore(root)                      # many queues by name under one directory
    queue = store.create("orders.q3.g1.i7", start_offset=0)
    first = queue.append([b"...", b"..."], ts_ms)  # offsets first, first + 1
    records = queue.read(first, max_records=100, max_bytes=1 << 20)

Layout and recovery: see segment.py; record framing: record.py; every bound: limits.py.
"""

from .config import FLUSH_FSYNC, FLUSH_GROUP, FLUSH_INTERVAL, QueueConfig
from .errors import (BatchTooLarge, CorruptData, CorruptQueue, InvalidArgument, InvalidQueueName, OffsetOutOfRange,
                     QueueClosed, QueueExists, QueueFailed, QueueNotFound, RecordTooLarge, StorageError,
                     TooManyQueues, UnsupportedFormat)
from .handles import HandlePool
from .names import dir_name, queue_name
from .queue import PhysicalQueue
from .record import ProducerMark, Record, Run
from .store import QueueStore

__all__ = [
    "FLUSH_FSYNC", "FLUSH_GROUP", "FLUSH_INTERVAL", "QueueConfig",
    "BatchTooLarge", "CorruptData", "CorruptQueue", "InvalidArgument", "InvalidQueueName", "OffsetOutOfRange",
    "QueueClosed", "QueueExists", "QueueFailed", "QueueNotFound", "RecordTooLarge", "StorageError", "TooManyQueues",
    "UnsupportedFormat",
    "HandlePool", "dir_name", "queue_name", "PhysicalQueue", "ProducerMark", "Record", "Run", "QueueStore",
]
