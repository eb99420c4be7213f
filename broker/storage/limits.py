"""Every bound of physical queue storage in one place, each with its unit last (DESIGN.md invariant 9)."""

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

# One record: its payload (a message in the form the broker stored it), behind its 4-byte size.
RECORD_BYTES_MAX = 4 * MIB
RECORD_SIZE_BYTES = 4

# One append call: a batch is one frame (record.py), written with one write, never split across files.
BATCH_RECORDS_MAX = 10_000
BATCH_BYTES_MAX = 16 * MIB
FRAME_HEADER_BYTES = 56
FRAME_BYTES_MAX = BATCH_BYTES_MAX + BATCH_RECORDS_MAX * RECORD_SIZE_BYTES   # the records of one frame
# A recovery scan hands back the producer marks of this many of the last frames it walked: the broker keeps 8
# batches of each of at most 1,000 producers per queue (broker/producers.py)
RECOVERED_MARKS_MAX = 8_192

# One read call. A read returns at least one record when one exists, even if it alone exceeds its byte budget,
# so that a consumer with a small budget is never stuck behind a large record.
READ_RECORDS_MAX = 10_000
READ_RECORDS_DEFAULT = 1_000
READ_BYTES_MAX = 16 * MIB
READ_BYTES_DEFAULT = 1 * MIB
# pread sizes for reads: small enough not to copy much more than asked, large enough to amortise the syscall.
READ_CHUNK_BYTES_MIN = 16 * KIB
READ_CHUNK_BYTES_MAX = 4 * MIB
# A read that must not wait (PhysicalQueue.try_read_runs, on the broker's event loop) copies chunks up to this size.
CACHED_READ_CHUNK_BYTES_MAX = 1 * MIB
# pread size while scanning a whole file on recovery or index rebuild.
SCAN_CHUNK_BYTES = 1 * MIB

# Segment files. A file rolls before a batch that would take it past segment_bytes_max, unless it is empty,
# so no file exceeds segment_bytes_max + one batch.
SEGMENT_BYTES_MAX_DEFAULT = 64 * MIB
SEGMENT_BYTES_LIMIT_MIN = 1 * KIB
SEGMENT_BYTES_LIMIT_MAX = 1 * GIB
SEGMENT_FILE_BYTES_MAX = SEGMENT_BYTES_LIMIT_MAX + FRAME_HEADER_BYTES + FRAME_BYTES_MAX

# Sparse index: an entry every so many bytes or records, whichever comes first. Its memory is about
# 16 bytes per interval of data (64 KiB per full default segment); a lookup scans at most one interval.
INDEX_INTERVAL_BYTES_DEFAULT = 16 * KIB
INDEX_INTERVAL_BYTES_MIN = 1
INDEX_INTERVAL_BYTES_MAX = 16 * MIB
INDEX_INTERVAL_RECORDS_DEFAULT = 256
INDEX_INTERVAL_RECORDS_MIN = 1
INDEX_INTERVAL_RECORDS_MAX = 1_000_000

# Flush policy "interval": the owner calls maybe_flush(now_ms) and data is fsynced once it has waited this long.
FLUSH_INTERVAL_MS_DEFAULT = 1_000
FLUSH_INTERVAL_MS_MAX = 60_000

# Offsets and timestamps fit a signed 64-bit integer, so every other system (JSON, Java, SQL) can hold them.
OFFSET_MAX = 2**63 - 1
TS_MS_MAX = 2**63 - 1

# Read handles of sealed segment files kept open per store (the active file of each open queue has its own).
READ_HANDLES_MAX_DEFAULT = 256
READ_HANDLES_MAX_MIN = 1

# Queue names and the store.
QUEUE_NAME_BYTES_MAX = 200
DIR_NAME_BYTES_MAX = 255
QUEUES_MAX = 100_000

# Relations the code relies on: index positions are u32, relative offsets are u32, a record fits a batch.
assert SEGMENT_FILE_BYTES_MAX < 2**32
assert RECORD_BYTES_MAX <= BATCH_BYTES_MAX
assert READ_BYTES_DEFAULT <= READ_BYTES_MAX and READ_RECORDS_DEFAULT <= READ_RECORDS_MAX
assert SEGMENT_BYTES_LIMIT_MIN <= SEGMENT_BYTES_MAX_DEFAULT <= SEGMENT_BYTES_LIMIT_MAX
assert READ_CHUNK_BYTES_MIN <= READ_CHUNK_BYTES_MAX
