"""The projection on each backend (SQLite, a temp file; PostgreSQL, a throw-away server from tests/support/pg.py) as
fixtures, and one scenario of events that uses every fold. A module that uses the fixtures imports them, and
``pg_url`` with them (``new_url`` asks for it by name).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import sqlalchemy as sa

from meta import limits
from meta.events import make, stored
from meta.projection import SqlProjection, schema
from wire.json_body import canonical
from tests.support.pg import create_database, drop_database


BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def new_url(request, tmp_path):
    """Factory of empty databases on the backend under test."""
    if request.param == "sqlite":
        names = itertools.count()
        yield lambda: f"sqlite:///{tmp_path}/projection-{next(names)}.db"
        return
    server = request.getfixturevalue("pg_url")
    made: list[str] = []

    def new() -> str:
        made.append(create_database(server))
        return made[-1]

    yield new
    for url in made:
        drop_database(server, url)


@pytest.fixture
def url(new_url) -> str:
    return new_url()


@pytest.fixture
def projection(url):
    p = SqlProjection(url)
    p.migrate()
    yield p
    p.close()


class Log:
    """Builds stored events the way the meta node stores them: versions 1, 2, ..., ts = 1000 + version."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def add(self, event_type: str, **fields: Any) -> int:
        version = len(self.events) + 1
        self.events.append(stored(version, 1_000 + version, make(event_type, **fields)))
        return version


def segments_of(topic: str, inc: int, placement: dict[int, str]) -> list[dict[str, Any]]:
    return [{"queue": q, "broker": b, "physical_queue": f"{topic}-{inc}-{q}-0", "budget_end": 1_000,
             "replicas": [b]} for q, b in placement.items()]


def scenario() -> list[dict[str, Any]]:
    """A topic's life: created with 4 queues on 2 brokers, queue 1 remapped, grown to 6 with barriers, broker
    sessions fenced and renewed, config changed; then a second topic created and the first deleted (v22, v23)."""
    log = Log()
    log.add("BrokerRegistered", broker="b1", address="http://b1:8080", zone="z1", cluster="DefaultCluster", disk=None, epoch=1)  # 1
    log.add("BrokerRegistered", broker="b2", address="http://b2:8080", zone="z2", cluster="DefaultCluster", disk=None, epoch=1)  # 2
    log.add("TopicCreated", replicas=1, min_insync=1, scope="global", topic="orders", incarnation=3, queues=4, slots=16, order="strict",        # 3
            config={"retention_ms": 86_400_000},
            slot_table=[[0, 3, 0], [4, 7, 1], [8, 11, 2], [12, 15, 3]],
            segments=segments_of("orders", 3, {0: "b1", 1: "b2", 2: "b1", 3: "b2"}))
    log.add("OffsetBudgetGranted", topic="orders", queue=1, gen=0, broker="b2", budget_end=2_000)    # 4
    # remap queue 1 from b2 to b1
    log.add("SegmentSealing", topic="orders", queue=1, gen=0, broker="b2")                           # 5
    log.add("SegmentOpened", topic="orders", queue=1, gen=1, broker="b1", replicas=["b1"], in_sync=["b1"], from_broker="b2",          # 6
            physical_queue="orders-3-1-1", physical_start=0, budget_end=1_000, cause="remap")
    log.add("SegmentSealed", topic="orders", queue=1, gen=0, broker="b2", physical_end=1_500,        # 7
            logic_end=1_500, by="broker")
    log.add("LogicStartDecided", topic="orders", queue=1, gen=1, logic_start=1_500)                  # 8
    # grow to 6 queues: queue 4 takes slots 6-7 from queue 1, queue 5 takes 14-15 from queue 3
    log.add("SegmentSealing", topic="orders", queue=1, gen=1, broker="b1")                           # 9
    log.add("SegmentOpened", topic="orders", queue=1, gen=2, broker="b1", replicas=["b1"], in_sync=["b1"], from_broker="b1",          # 10
            physical_queue="orders-3-1-1", physical_start=300, budget_end=1_300, cause="grow")
    log.add("SegmentSealing", topic="orders", queue=3, gen=0, broker="b2")                           # 11
    log.add("SegmentOpened", topic="orders", queue=3, gen=1, broker="b2", replicas=["b2"], in_sync=["b2"], from_broker="b2",          # 12
            physical_queue="orders-3-3-0", physical_start=700, budget_end=1_700, cause="grow")
    log.add("TopicGrown", topic="orders", queues=6,                                                  # 13
            slot_table=[[0, 3, 0], [4, 5, 1], [6, 7, 4], [8, 11, 2], [12, 13, 3], [14, 15, 5]],
            barriers=[{"queue": 4, "after_queue": 1, "after_gen": 2}, {"queue": 5, "after_queue": 3, "after_gen": 1}],
            segments=segments_of("orders", 3, {4: "b2", 5: "b1"}))
    log.add("SegmentSealed", topic="orders", queue=1, gen=1, broker="b1", physical_end=300,          # 14
            logic_end=1_800, by="broker")
    log.add("LogicStartDecided", topic="orders", queue=1, gen=2, logic_start=1_800)                  # 15
    # broker sessions: b2 expires and comes back with epoch 2; a late fence of epoch 1 must not touch epoch 2
    log.add("BrokerFenced", broker="b2", epoch=1, reason="session_expired")                          # 16
    log.add("BrokerRegistered", broker="b2", address="http://b2-new:8080", zone="z2", cluster="DefaultCluster", disk=None, epoch=2)  # 17
    log.add("BrokerFenced", broker="b2", epoch=1, reason="registered_again")                         # 18
    log.add("BrokerFenced", broker="b1", epoch=1, reason="session_expired")                          # 19
    log.add("BrokerUnfenced", broker="b1", epoch=1)                                                  # 20
    log.add("TopicConfigChanged", topic="orders", config={"retention_ms": 3_600_000, "max_bytes": 1 << 20},
            changed=["retention_ms", "max_bytes"])                                                   # 21
    log.add("TopicCreated", replicas=1, min_insync=1, scope="global", topic="audit", incarnation=22, queues=1, slots=4, order="best_tried",    # 22
            config={}, slot_table=[[0, 3, 0]], segments=segments_of("audit", 22, {0: "b1"}))
    log.add("TopicDeleted", topic="orders")                                                          # 23
    return log.events


def lines_of(events: list[dict[str, Any]]) -> list[str]:
    """The events as the image's history keeps them (meta/image.py ``_record``): canonical JSON lines."""
    return [canonical(e).decode() for e in events]


# Text a parser of lines could mistake for structure: quotes, escapes, the keys of a stored event, JSON's own
# punctuation, and characters outside ASCII (two, three and four UTF-8 bytes) and outside JSON's plain set.
TRICKY = 'é中🎉 "q" \\ \n\t\x01\x1f \u2028 ,"topic":"x","ts":1,"type":"T","v":1,"version":9} {"data":'


def edge_events() -> list[dict[str, Any]]:
    """Stored events whose data is hard to carry as text: unicode and escapes everywhere (keys too), nested values of
    every JSON kind, and the largest a topic's creation and config can be (meta/limits.py); every kind of fold
    (a state change, a history-only lock event, a type this code does not know)."""
    log = Log()
    log.add("BrokerRegistered", broker="b1", address="http://b1:8080/é", zone=TRICKY, cluster="DefaultCluster",
            disk=None, epoch=1)
    # limits.CONFIG_KEYS_MAX keys and values of their largest size, each with the tricky text in it
    config = {f"{i:03d}{TRICKY}".ljust(limits.CONFIG_KEY_CHARS_MAX, "k"): (TRICKY * 40)[:limits.CONFIG_VALUE_CHARS_MAX]
              for i in range(limits.CONFIG_KEYS_MAX)}
    topic = "t" * limits.TOPIC_NAME_CHARS_MAX
    queues = limits.QUEUES_PER_TOPIC_MAX
    log.add("TopicCreated", replicas=1, min_insync=1, scope="global", topic=topic, incarnation=2, queues=queues,
            slots=queues, order="strict", config=config, slot_table=[[q, q, q] for q in range(queues)],
            segments=segments_of(topic, 2, {q: "b1" for q in range(queues)}))
    log.add("TopicConfigChanged", topic=topic, config={TRICKY: TRICKY, "topic": "not the event's"},
            changed=[TRICKY, "topic"])
    log.add("LockGranted", group=TRICKY, topic=topic, queue=7, member=TRICKY, token=2**63 - 1)
    version = len(log.events) + 1
    log.events.append({"version": version, "ts": 1_000 + version, "type": "TopicRenamed", "v": 2, "topic": None,
                       "data": {TRICKY: [1, -1, 0, 2**63 - 1, -2**63, 1.5, -0.25, 1e16, 1e-7, True, False, None,
                                         "", [], {}, [[[{"topic": TRICKY}]]]],
                                "topic": {"topic": {"ts": 1}}, "nested": {"a": {"b": {"c": {"d": [TRICKY]}}}}}})
    return log.events


def rows(url: str, table: sa.Table) -> list[dict[str, Any]]:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            query = sa.select(table).order_by(*table.primary_key.columns)
            return [dict(r._mapping) for r in conn.execute(query)]
    finally:
        engine.dispose()


def snapshot(url: str) -> dict[str, list[dict[str, Any]]]:
    return {t.name: rows(url, t) for t in schema.metadata.sorted_tables}
