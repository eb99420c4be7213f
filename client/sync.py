"""Blocking wrappers for scripts: each wrapper runs its asyncio client on a private event loop in a daemon thread.

    with SyncAdminClient(urls, admin_token) as admin:
        admin.create_topic("orders", 8)
    with SyncProducer(urls, client_token, "orders") as p:
        p.send("hello", key="customer-42")

Every call waits at most ``call_timeout_s`` (plus a poll's own timeout) on top of the bounds of the async client, then
raises ``TimeoutError``. ``close()`` (or leaving ``with``) closes the client and stops the loop and its thread.
Not for use from inside a running event loop: use the async classes there. Bodies come back as ``bytes`` (``m.text``
decodes them), and ``wire_format`` passes through to the async client as every other argument does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from .admin import AdminClient
from .consumer import PullConsumer, ReceivedMessage
from .exclusive import ExclusiveConsumer
from .producer import Producer

CALL_TIMEOUT_S_DEFAULT = 90.0
THREAD_JOIN_S_MAX = 10.0


class _LoopThread:
    """An event loop running forever in its own daemon thread, until ``stop``."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, Any], timeout_s: float) -> Any:
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"no outcome within {timeout_s} s") from None

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(THREAD_JOIN_S_MAX)
        if not self._thread.is_alive():
            self.loop.close()


def _blocking(method: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Any]:
    """A blocking method that runs the async method of the same name on the wrapper's loop."""
    @functools.wraps(method)
    def call(self: _Blocking, *args: Any, **kwargs: Any) -> Any:
        return self._run(getattr(self._client, method.__name__)(*args, **kwargs))
    return call


def _in_loop(method: Callable[..., Any]) -> Callable[..., Any]:
    """A blocking method that runs a plain method of the async client on its loop (it touches loop-owned state)."""
    @functools.wraps(method)
    def call(self: _Blocking, *args: Any, **kwargs: Any) -> Any:
        async def run() -> Any:
            return getattr(self._client, method.__name__)(*args, **kwargs)
        return self._run(run())
    return call


class _Blocking:
    _make: Callable[..., Any]

    def __init__(self, *args: Any, call_timeout_s: float = CALL_TIMEOUT_S_DEFAULT, **kwargs: Any):
        self.call_timeout_s = call_timeout_s
        self._closed = False
        self._loop_thread = _LoopThread(f"stator-{type(self).__name__}")

        async def create() -> Any:  # in the loop, so anything the client binds to a loop binds to this one
            return type(self)._make(*args, **kwargs)
        try:
            self._client = self._loop_thread.run(create(), call_timeout_s)
        except BaseException:
            self._loop_thread.stop()
            raise

    def _run(self, coro: Coroutine[Any, Any, Any], extra_s: float = 0.0) -> Any:
        if self._closed:
            coro.close()
            raise RuntimeError(f"this {type(self).__name__} is closed")
        return self._loop_thread.run(coro, self.call_timeout_s + extra_s)

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._run(self._client.close())
        finally:
            self._closed = True
            self._loop_thread.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SyncAdminClient(_Blocking):
    """``AdminClient`` with blocking methods; same arguments."""
    _make = AdminClient
    create_topic = _blocking(AdminClient.create_topic)
    describe_topic = _blocking(AdminClient.describe_topic)
    list_topics = _blocking(AdminClient.list_topics)
    grow_topic = _blocking(AdminClient.grow_topic)
    set_config = _blocking(AdminClient.set_config)
    remap = _blocking(AdminClient.remap)
    delete_topic = _blocking(AdminClient.delete_topic)
    brokers = _blocking(AdminClient.brokers)
    cluster = _blocking(AdminClient.cluster)
    history = _blocking(AdminClient.history)
    set_group_config = _blocking(AdminClient.set_group_config)
    list_groups = _blocking(AdminClient.list_groups)
    describe_group = _blocking(AdminClient.describe_group)


class SyncProducer(_Blocking):
    """``Producer`` with blocking methods; same arguments."""
    _make = Producer
    start = _blocking(Producer.start)
    send = _blocking(Producer.send)
    send_batch = _blocking(Producer.send_batch)


class SyncPullConsumer(_Blocking):
    """``PullConsumer`` with blocking methods; same arguments. Iterating yields messages until ``close()``."""
    _make = PullConsumer
    start = _blocking(PullConsumer.start)
    queues = _blocking(PullConsumer.queues)
    pull = _blocking(PullConsumer.pull)
    position = _blocking(PullConsumer.position)
    committed = _blocking(PullConsumer.committed)
    min_offset = _blocking(PullConsumer.min_offset)
    commit = _blocking(PullConsumer.commit)
    commit_positions = _blocking(PullConsumer.commit_positions)
    seek = _in_loop(PullConsumer.seek)

    def poll(self, timeout_s: float = 0.0) -> list[ReceivedMessage]:
        return self._run(self._client.poll(timeout_s), extra_s=timeout_s)

    def __iter__(self) -> Iterator[ReceivedMessage]:
        while not self._closed:
            yield from self.poll(timeout_s=1.0)


def _threaded_exclusive(meta_urls: Any, token: str, topic: str, group: str,
                        handler: Callable[[ReceivedMessage], Any], **kwargs: Any) -> ExclusiveConsumer:
    """An ``ExclusiveConsumer`` whose plain-function handler runs in a worker thread: a slow handler must not hold up
    the heartbeats that keep the consumer's leases."""
    async def in_thread(m: ReceivedMessage) -> Any:
        return await asyncio.to_thread(handler, m)
    return ExclusiveConsumer(meta_urls, token, topic, group, in_thread, **kwargs)


class SyncExclusiveConsumer(_Blocking):
    """``ExclusiveConsumer`` for scripts: same arguments, but ``handler`` is a plain function (run in a thread).
    ``start()`` joins the group and consumes in the background until ``close()``, which raises a background
    failure, as ``failure`` shows it meanwhile."""
    _make = staticmethod(_threaded_exclusive)
    start = _blocking(ExclusiveConsumer.start)
    held = _in_loop(ExclusiveConsumer.held)
    positions = _in_loop(ExclusiveConsumer.positions)

    @property
    def failure(self) -> BaseException | None:
        return self._client.failure
