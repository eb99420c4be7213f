"""Storage errors, each with a stable API.md-style code and details: the HTTP layer maps them without parsing text."""

from __future__ import annotations

from typing import Any


class StorageError(Exception):
    code = "STORAGE_ERROR"

    def __init__(self, message: str, **details: Any):
        super().__init__(message)
        self.message = message
        self.details = details


class InvalidArgument(StorageError, ValueError):
    code = "INVALID_ARGUMENT"


class RecordTooLarge(InvalidArgument):
    code = "TOO_LARGE"


class BatchTooLarge(InvalidArgument):
    code = "TOO_LARGE"


class InvalidQueueName(InvalidArgument):
    code = "INVALID_ARGUMENT"


class OffsetOutOfRange(StorageError):
    """The offset is below the queue's first kept record (or, for truncation, past its end)."""

    code = "OFFSET_OUT_OF_RANGE"

    def __init__(self, message: str, *, offset: int, min_offset: int, max_offset: int):
        super().__init__(message, offset=offset, min_offset=min_offset, max_offset=max_offset)
        self.offset = offset
        self.min_offset = min_offset
        self.max_offset = max_offset


class CorruptData(StorageError):
    """Records from `offset` up to `next_offset` (exclusive) cannot be read: a sealed file is damaged.

    A reader can resume at `next_offset`; recovery never rewrites a sealed file, so the damage stays visible."""

    code = "CORRUPT_DATA"

    def __init__(self, message: str, *, offset: int, next_offset: int | None):
        super().__init__(message, offset=offset, next_offset=next_offset)
        self.offset = offset
        self.next_offset = next_offset


class CorruptQueue(StorageError):
    """The queue directory cannot be opened as a queue at all (no segment file)."""

    code = "CORRUPT_QUEUE"


class QueueClosed(StorageError):
    code = "QUEUE_CLOSED"


class QueueFailed(StorageError):
    """A write or fsync failed and could not be undone; the queue refuses writes until it is reopened and recovered."""

    code = "QUEUE_FAILED"


class QueueNotFound(StorageError):
    code = "QUEUE_NOT_FOUND"


class QueueExists(StorageError):
    code = "QUEUE_EXISTS"


class TooManyQueues(StorageError):
    code = "TOO_MANY_QUEUES"


class CorruptFile(StorageError):
    """A file the broker replays at start holds damaged acknowledged data; the broker refuses to start on it.

    The message is one line naming the file and where in it the damage begins."""

    code = "CORRUPT_FILE"


class UnsupportedFormat(StorageError):
    """The store's directory holds queues in a storage format this build does not read (before 1.0 there is no
    upgrade path): refused by name, never read as damaged data and cut."""

    code = "UNSUPPORTED_FORMAT"
