"""The state machine's tables: every command has one decider, every event one domain and one replay.

The decisions themselves are tested through the state machine (tests/test_state_machine.py and the rest); these
tests keep the explicit tables that route to them complete and consistent with each other.
"""

from __future__ import annotations

import pytest

from meta import commands, events, image, state_machine
from meta.deciders import brokers, groups, history, replicas, segments, topics
from meta.projection import fold
from meta.state_machine import StateMachine

DOMAIN_TABLES = {"brokers": brokers.DECIDERS, "topics": topics.DECIDERS, "segments": segments.DECIDERS,
                 "replicas": replicas.DECIDERS, "groups": groups.DECIDERS, "history": history.DECIDERS}


def test_every_validated_command_has_exactly_one_decider():
    owners: dict[str, list[str]] = {}
    for domain, table in DOMAIN_TABLES.items():
        for name in table:
            owners.setdefault(name, []).append(domain)
    assert {n: d for n, d in owners.items() if len(d) != 1} == {}
    assert set(owners) == set(commands.VALIDATORS)
    assert state_machine.DECIDERS == {n: f for t in DOMAIN_TABLES.values() for n, f in t.items()}


def test_every_event_has_exactly_one_domain():
    for name in events.EVENT_SCHEMAS:
        assert [d for d, names in events.DOMAINS.items() if name in names] != [], name
        assert len([d for d, names in events.DOMAINS.items() if name in names]) == 1, name
    assert set().union(*events.DOMAINS.values()) == set(events.EVENT_SCHEMAS)


def test_the_group_events_are_those_naming_a_group():
    # image.replay keys a group's event by its "group" field; an event of another domain naming a group would be
    # keyed by its topic instead, and be replayed as the topic's change.
    naming_a_group = {name for name, (_, fields) in events.EVENT_SCHEMAS.items() if "group" in fields}
    assert events.GROUP_EVENTS == naming_a_group


def test_each_domain_replays_its_own_events():
    assert set(image.BROKER_REPLAYS) == events.BROKER_EVENTS
    assert set(image.TOPIC_REPLAYS) == events.TOPIC_EVENTS
    assert set(image.GROUP_REPLAYS) == events.GROUP_EVENTS
    assert set(image.REPLAYS) == set(events.EVENT_SCHEMAS)


def test_the_projection_folds_every_event():
    assert set(fold.FOLDS) == set(events.EVENT_SCHEMAS)


def test_an_event_is_made_with_exactly_its_schemas_fields():
    assert events.make("TopicDeleted", topic="t") == {"type": "TopicDeleted", "v": 1, "topic": "t"}
    with pytest.raises(ValueError, match="schema"):
        events.make("TopicDeleted", topic="t", queue=1)   # a field the schema does not name
    with pytest.raises(ValueError, match="schema"):
        events.make("TopicDeleted")                       # one it names, missing
    # Stored, its fields but type and v are its data; the event itself is left as it was.
    event = events.make("TopicDeleted", topic="t")
    assert events.stored(7, 70, event) == {"version": 7, "ts": 70, "type": "TopicDeleted", "v": 1, "topic": "t",
                                           "data": {"topic": "t"}}
    assert event == {"type": "TopicDeleted", "v": 1, "topic": "t"}


def test_an_unknown_event_is_refused_by_replay():
    with pytest.raises(events.UnknownEvent):
        image.Image().replay({"type": "NoSuchEvent", "v": 1}, 1000)


@pytest.mark.parametrize("cmd", [{"type": "NoSuchCommand"}, {"type": "_remember"}, {"type": "apply"},
                                 {"type": "__init__"}, {"type": 17}, {}])
def test_an_unknown_command_is_the_same_rejection_as_ever(cmd):
    sm = StateMachine()
    outcome, changed = sm.apply({"rid": None, "ts": 1000, "actor": "admin", "cmd": cmd})
    assert not outcome["ok"] and changed == set()
    assert outcome["error"]["status"] == 400 and outcome["error"]["code"] == "INVALID_ARGUMENT"
    assert outcome["error"]["message"] == "unknown command"
