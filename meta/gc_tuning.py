"""The cyclic collector's thresholds of a meta node's processes: the node (meta/serve.py sets them after the zygote)
and each projection writer (meta/projection/writer_process.py sets them at its start, and freezes its imports).

CPython's default young generation is 700 net new objects. Both processes keep many young objects alive for a few
milliseconds, and a young collection that finds them alive promotes them; full collections follow as the old
generation grows by a quarter, each walking everything the process holds.
- The node: its heap grows with every write (the image's remembered request outcomes, up to meta/limits.py
  REQUEST_OUTCOMES_MAX), and a young collection every few milliseconds found the 64 requests in flight alive.
  vs_etcd's 64 writers for 40 s (ops/bench, 2026-12-04): 2.2 s of collection a node, 13-15 full ones of 150-180 ms
  (p99 101-109 ms); with 10,000 young objects: 0.3 s a node, no full one, p99 40 ms, 12% more writes/s.
- A writer: a batch of hundreds of small events keeps ~15 objects each alive until it is written.
Kept here, not in the node's server module, so that a writer started afresh does not import the server to read them.
"""

GC_THRESHOLDS = (10_000, 20, 10)
