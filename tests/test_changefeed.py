"""The change feed's log of changed topics: what lets an all-topic watch stream skip the topics that did not change."""

from __future__ import annotations

import asyncio

from meta.changefeed import ANY, TOPICS, ChangeFeed


def test_changed_since_names_only_topics_changed_after_the_version():
    feed = ChangeFeed()
    feed.publish(3, {"a"})
    feed.publish(5, {"b", "c"})
    feed.publish(6, set())          # a command that changed no topic (a broker heartbeat's unfence, say)
    feed.publish(9, {"a"})
    assert feed.changed_since(0) == {"a", "b", "c"}
    assert feed.changed_since(5) == {"a"}
    assert feed.changed_since(9) == set()


def test_the_log_is_bounded_and_says_when_it_no_longer_reaches_back():
    feed = ChangeFeed(change_log_entries_max=3)
    for v in range(1, 6):
        feed.publish(v, {f"t{v}"})
    assert feed.changed_since(4) == {"t5"}
    assert feed.changed_since(1) is None, "entries of versions 2 and below fell out: the caller must rescan"
    feed.publish(7, None)           # a snapshot was installed: anything may have changed
    assert feed.changed_since(5) is None
    assert feed.changed_since(7) == set()


async def test_topic_waiters_wake_only_for_topic_changes():
    feed = ChangeFeed()
    topics = asyncio.create_task(feed.wait(TOPICS, 1.0))
    anything = asyncio.create_task(feed.wait(ANY, 1.0))
    await asyncio.sleep(0)
    feed.publish(1, set())
    await asyncio.sleep(0)
    assert anything.done() and not topics.done()
    feed.publish(2, {"a"})
    assert await topics is True


def test_a_change_of_many_topics_into_a_full_log_never_claims_what_fell_out():
    """One command can change many topics (a broker fenced, a topic grown): every entry it pushes out of a full log
    moves the point from which the log is complete, not only the first. Claiming too much made an all-topic watch
    stream skip a topic's change."""
    feed = ChangeFeed(change_log_entries_max=3)
    feed.publish(1, {"a"})
    feed.publish(2, {"b"})
    feed.publish(3, {"c"})
    feed.publish(4, {"d", "e"})     # pushes out a (v1) and b (v2)
    assert feed.changed_since(1) is None, "b's change at version 2 is gone from the log"
    assert feed.changed_since(2) == {"c", "d", "e"}
