"""Pop consumption on the broker (API.md pop rows; issue 9): shared consumers, invisible time, ack, revive, DLQ.

Modules, one job each: ``limits`` (every bound), ``handles`` (receipt handles, HMAC'd), ``state`` (one queue's pop
state, pure), ``journal`` (the durable, group-committed log of that state), ``replica`` (the pop state held as a copy
of queues led elsewhere), ``revive`` (the deadline heap), ``dlq``
(dead-letter queues), ``settings`` (max_attempts from meta's group events), ``wakeup`` (long-poll wake-ups),
``params`` (request bodies), ``metrics`` (the operator's view), ``service`` (ties them together). Nothing is
imported here, so broker modules can import a piece without pulling in the service.

State. Per (group, topic, logic queue): the pop offset (every logic offset below it was handed out at least once)
and the in-flight table, offset -> (delivery seq, attempt, deadline). An ack removes the entry; the revive heap
makes an entry whose deadline passed *ready*: the next pop delivers it again (ready entries before new messages,
over every queue, so a busy queue never starves retries) with attempt + 1, or, past the group's max_attempts, it
goes once to the group's DLQ. Durability: every change is a line of the journal; acks and changes of invisible
time are answered after the fsync covering them; a first delivery is written only once it is 400 ms old, so a pop
acked within that costs no write (the pop offset line, coalesced per round, is all). The written pop offset never
passes an unwritten, unacked delivery: a kill -9 can bring back a message popped in the last 400 ms before its
invisible time (at least once), never lose one, and never bring back an acked one.

Refusals (limits.py has every bound): 400 INVALID_ARGUMENT (max 1-1,000, invisible_ms 1 s-12 h, wait_ms 0-30 s,
1-1,000 handles per ack); ``POST /v1/invisible`` 400 INVALID_HANDLE (malformed or unknown) or 409 HANDLE_EXPIRED
(acked, delivered again, given a new handle or dead-lettered); 404 TOPIC_NOT_FOUND / QUEUE_NOT_FOUND; 409 NOT_LEADER
(``queue`` whose head is elsewhere); 409 TOO_MANY_IN_FLIGHT (every queue popped holds 20,000 invisible messages of
the group, or the broker 2,000,000); 409 TOO_MANY_POP_QUEUES (100,000 keys); 503 TOO_MANY_WAITERS (1,000 parked
long polls, or 10,000 acks waiting for the disk), SEALING, CATCHING_UP (the meta session lapsed, or routes not
followed up to the registration yet), BROKER_UNAVAILABLE (an older head to take the state over from is down),
STORAGE_UNAVAILABLE (the journal failed).

Handles. ``seq`` grows per delivery and carries the broker's incarnation (bumped durably at each start) in its high
bits, so a delivery made after a restart always outranks one made before: a handle whose offset has a later delivery
in flight is HANDLE_EXPIRED, one that verifies but names nothing delivered is INVALID_HANDLE, like a malformed one.

Across remaps (RocketMQ has no pop on logic queues). The pop offset of a logic queue lives with its head: only the
broker holding the writable head pops it (the others answer NOT_LEADER, or skip it in a topic-wide pop), and it reads
the whole history through broker/reads.py, so messages of the sealed segment not popped yet are popped from the new
head. The state records the head's ``gen`` it was popped under. The first pop of a queue on a new head (a state
missing or of an older gen) takes the state over: it asks the brokers of the older segments, newest first, for their
state (``POST /v1/pop-handover/...``). Each such broker first waits until its routes are as new as the asker's, so it
knows it lost the head and no pop of its own can move the pop offset again; it then freezes its state (durably) and
answers its gen and pop offset. The new head continues from the pop offset of the newest gen found (the queue's min
offset if none), so nothing is skipped and nothing handed out there is handed out again. A broker that cannot be
reached stops the takeover with 503 BROKER_UNAVAILABLE: starting without its offset could deliver twice.
A frozen state's in-flight deliveries all go to the current head at once, due or not (``POST /v1/pop-adopt/...``,
each with its deadline), which records them durably, invisible until their deadline and then delivered again before
new messages; the old broker refuses their handles from the freeze on (HANDLE_EXPIRED) and removes them only after
the head's answer (and pushes again later if it fails); a restart of the old broker starts that over. One owner
per delivery: kept on the old broker until due, they sat on its disk alone, and a wipe lost them (the chaos runner,
seed 7). Dead letters of a frozen state are written by the old broker itself (it reads the message by logic offset).
Known window: if the old broker dies after the new head recorded an adopted delivery but before its own removal was
fsynced, it pushes that delivery again after its restart, and the new head may deliver it once more.

Across failovers (issue 37). A queue's head has copies (broker/replication): each round of the journal also brings its
lines to the head's in-sync copies before it answers (broker/replication/pop_copies.py), which keep them apart from
their own state (``replica``). A copy a failover elects does not ask the lost leader: it takes the state over from its
own copy (``_state_for``), the lost leader's deliveries in flight included, which come due here (their handles were
the lost leader's and are refused here: delivered again, at least once).
"""
