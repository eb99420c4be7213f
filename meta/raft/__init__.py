"""The meta log's Raft: pysyncobj decides elections, replication and the commit index; everything around it is ours.

- ``node``: MetaSyncObj (the pysyncobj node: proposals, apply, snapshots) and RaftNode, its asyncio face.
- ``pysyncobj_shim``: every reach into pysyncobj's internals, pinned to one version.
- ``journal`` and ``group_commit``: the log on disk (checksummed segments, group-committed syncs).
- ``transport`` and ``wire_format``: the raft port (framing, handshake, AES-GCM sessions, the message codec).
- ``roles`` and ``membership``: voters and learners, membership changes through the log.
- ``prevote``: no campaign without a majority's pre-vote; ``read_index``: linearizable reads without an entry.
- ``local_commit``: with three voters a follower commits on the leader's word that its disk holds the entries too.
- ``entry``, ``proposals``, ``applier``: the bytes of an entry, batching proposals into entries, the apply thread.
- ``snapshot_file``: the snapshot's format and its background writer.
"""
