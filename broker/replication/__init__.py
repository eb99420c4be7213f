"""Copies of a queue's head on other brokers (DESIGN.md invariant 12), with who holds them decided in meta's log.

- ``frames.py``    the runs of records as they lie on disk, in a stream's binary messages and a fetch's answer
- ``source.py``    what a broker sends its followers: a stream of the open heads it leads, a fetch of sealed copies
- ``leader.py``    the leader's side: what each follower holds, the high watermark, sends waiting until every
                   in-sync copy holds their records, and the in-sync set it asks meta to change
- ``follower.py``  the follower's side: one stream per broker it copies from, and the catch-up of sealed copies

The leader pushes what it writes (RocketMQ's HA service); the follower acknowledges, per queue, the offset it holds
durably. A copy's physical queue has the same name on every broker; its name names the gen, which is the queue's
leader epoch, so a record of an older leader cannot reach a newer copy.
"""
