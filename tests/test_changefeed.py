"""The change feed's log of changed topics: what lets an all-topic watch stream skip the topics that did not change."""

from __future__ import annotations

import asyncio

from meta.changefeed import ANY, TOPICS, WAKE_SLICE, ChangeFeed


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


async def test_a_publish_wakes_every_waiter_of_the_topic_in_slices_and_no_other():
    """A thousand waiters on one topic all wake, a slice per loop pass; waiters on another topic stay asleep."""
    feed = ChangeFeed()
    n = 10 * WAKE_SLICE + 3
    waiters = [asyncio.create_task(feed.wait("a", 5.0)) for _ in range(n)]
    other = asyncio.create_task(feed.wait("b", 5.0))
    await asyncio.sleep(0)
    assert feed.waiting() == n + 1
    feed.publish(1, {"a"})
    assert await asyncio.wait_for(asyncio.gather(*waiters), 5.0) == [True] * n
    assert not other.done(), "a change of topic a woke a waiter of topic b"
    assert feed.waiting() == 1
    other.cancel()


async def test_an_answer_queued_after_a_publish_runs_before_most_waiters_wake():
    """The tick thread hands the loop a command's changes, then its proposer's answer, in one batch: the answer must
    not wait until every subscriber of the changed topic has run (the write's ack took as long as the fan-out)."""
    feed = ChangeFeed()
    n = 20 * WAKE_SLICE
    woken = 0

    async def waiter() -> None:
        nonlocal woken
        assert await feed.wait("a", 5.0)
        woken += 1
    tasks = [asyncio.create_task(waiter()) for _ in range(n)]
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    answered = loop.create_future()
    feed.publish(1, {"a"})
    # the answer as meta/raft/node.py hands it over: a future resolved right after the publish, awaited through wait_for
    loop.call_soon(answered.set_result, None)
    await asyncio.wait_for(answered, 5.0)
    woken_at_answer = woken
    await asyncio.wait_for(asyncio.gather(*tasks), 5.0)
    assert woken == n
    assert woken_at_answer <= 3 * WAKE_SLICE, f"{woken_at_answer} of {n} waiters ran before the answer"


async def test_close_cancels_waiters_still_to_be_woken():
    feed = ChangeFeed()
    waiters = [asyncio.create_task(feed.wait("a", 5.0)) for _ in range(3 * WAKE_SLICE)]
    await asyncio.sleep(0)
    feed.publish(1, {"a"})
    feed.close()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert feed.waiting() == 0
    assert all(r is True or isinstance(r, asyncio.CancelledError) for r in results)
    assert any(isinstance(r, asyncio.CancelledError) for r in results), "close left waiters to be woken later"


async def test_waiters_wake_in_the_order_they_came_whatever_the_topic_names_hash_to():
    # The simulator replays a schedule only if a publish wakes the same waiters in the same order every run: they
    # wake in the order they began waiting, per key, and the keys of a change in name order (not a set's order)
    feed = ChangeFeed()
    woke: list[str] = []

    async def waiter(key: str, name: str) -> None:
        await feed.wait(key, 5.0)
        woke.append(name)
    names = [("t9", "a"), ("t1", "b"), ("t9", "c"), ("t5", "d"), ("t1", "e")]
    tasks = [asyncio.create_task(waiter(key, name)) for key, name in names]
    await asyncio.sleep(0)
    feed.publish(1, {"t9", "t5", "t1"})
    await asyncio.wait_for(asyncio.gather(*tasks), 5.0)
    assert woke == ["b", "e", "d", "a", "c"]
