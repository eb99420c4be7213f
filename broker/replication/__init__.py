"""Copies of a queue's head on other brokers (DESIGN.md invariant 12), with who holds them decided in meta's log.

- ``frames.py``    the body of a fetch answer: the leader's runs of records as they lie on its disk
- ``leader.py``    the leader's side: what each follower has fetched, the high watermark, sends waiting until every
                   in-sync copy holds their records, and the in-sync set it asks meta to change
- ``follower.py``  the follower's side: one task per copy fetching from its leader (Kafka's fetch from the leader)

Followers pull, as Kafka's do: a fetch names the offset the follower holds durably, which is its acknowledgement,
and waits at the leader until there is more. A copy's physical queue has the same name on every broker; its name
names the gen, which is the queue's leader epoch, so a record of an older leader cannot reach a newer copy.
"""
