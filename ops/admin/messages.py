"""``stator produce`` and ``stator consume``: messages in and out from a terminal, as kafka-console-producer and
-consumer and ``nats pub``/``nats sub`` do, on the client library's Producer and PullConsumer.

``produce`` sends each line of its standard input as a message (or each ``--message``): lines that arrive together
go in one batch of at most PRODUCE_BATCH_MAX, a line typed alone is sent at once. ``consume`` reads without a group
(or from a group's committed offsets, ``--group``; it commits only with ``--commit``), from the oldest offset, an
``--offset``, or the first message stored at or after ``--since``; ``--message-key`` keeps one key's messages, and
``--follow`` waits for new ones until interrupted. Finding by key: client/browse.py; by time: the broker's own
index (``PullConsumer.offset_for_time``).
"""

from __future__ import annotations

import asyncio
import base64
import sys
import threading
from collections.abc import Iterable
from typing import Any

import click

from client import Message, Producer, PullConsumer, ReceivedMessage
from client import browse
from client.slots import queue_for_key
from wire.errors import INVALID_ARGUMENT
from wire.params import PULL_MESSAGES_MAX

from . import output
from .options import CliError, Globals, IsoTime, global_options

PRODUCE_BATCH_MAX = 100         # lines one send carries
LINES_QUEUED_MAX = 10_000       # lines read from stdin and not sent yet (the reader waits beyond)
LINE_BYTES_MAX = 4 * 1024 * 1024   # one line; longer is refused before anything of it is sent
CONSUME_MAX_DEFAULT = 100
CONSUME_MAX = 100_000
FOLLOW_IDLE_S = 1.0             # a follow's wait for new messages per round


def _prop(values: Iterable[str]) -> dict[str, str]:
    props = {}
    for v in values:
        k, sep, val = v.partition("=")
        if not sep or not k:
            raise CliError(INVALID_ARGUMENT, f"--prop {v!r}: give key=value")
        props[k] = val
    return props


def _stdin_lines(queue: asyncio.Queue, loop: asyncio.AbstractEventLoop, stop: threading.Event) -> None:
    """The reader thread: each line of stdin, without its newline, then None at the end."""
    try:
        for raw in sys.stdin.buffer:
            if stop.is_set():
                return
            line = raw.rstrip(b"\r\n")
            asyncio.run_coroutine_threadsafe(queue.put(line), loop).result()
    finally:
        asyncio.run_coroutine_threadsafe(queue.put(None), loop)


async def _lines(messages: tuple[str, ...]):
    """Batches of lines: the ``--message`` values, else stdin's lines as they come (what has arrived, at most
    PRODUCE_BATCH_MAX)."""
    if messages:
        for i in range(0, len(messages), PRODUCE_BATCH_MAX):
            yield [m.encode() for m in messages[i:i + PRODUCE_BATCH_MAX]]
        return
    queue: asyncio.Queue = asyncio.Queue(LINES_QUEUED_MAX)
    stop = threading.Event()
    reader = threading.Thread(target=_stdin_lines, args=(queue, asyncio.get_running_loop(), stop), daemon=True,
                              name="stdin-lines")
    reader.start()
    try:
        while True:
            first = await queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < PRODUCE_BATCH_MAX and not queue.empty():
                line = queue.get_nowait()
                if line is None:
                    yield batch
                    return
                batch.append(line)
            yield batch
    finally:
        stop.set()   # the thread ends at its next line or at stdin's end (a daemon: it never holds the exit)


def _body(line: bytes) -> str | bytes:
    """A line as text when it is UTF-8 (what a person types), else its bytes."""
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        return line


@click.command("produce")
@click.argument("topic")
@click.option("-m", "--message", "messages", multiple=True, metavar="TEXT",
              help="a message to send (repeatable); without it, each line of standard input is one")
@click.option("--message-key", metavar="KEY", help="every message's key: same key, same queue, in order")
@click.option("--queue", type=click.IntRange(min=0), help="send to this queue (default: by key, else round robin)")
@click.option("--prop", "props", multiple=True, metavar="K=V", help="a property of every message (repeatable)")
@global_options
async def produce(topic: str, messages: tuple[str, ...], message_key: str | None, queue: int | None,
                  props: tuple[str, ...], g: Globals) -> None:
    """Send messages to TOPIC: each --message, or each line of standard input (as kafka-console-producer)."""
    properties = _prop(props) or None
    sent: list[dict[str, Any]] = []
    async with Producer(g.endpoints, g.need_token(), topic, ssl_context=g.ssl_context) as producer:
        async for lines in _lines(messages):
            long = next((line for line in lines if len(line) > LINE_BYTES_MAX), None)
            if long is not None:
                raise CliError(INVALID_ARGUMENT, f"a line of {len(long)} bytes (at most {LINE_BYTES_MAX})")
            r = await producer.send_batch([Message(_body(line), message_key, properties) for line in lines],
                                          queue=queue)
            done = {"queue": r.queue, "offsets": r.offsets, "broker": r.broker}
            sent.append(done)
            if not g.json:
                first, last = r.offsets[0], r.offsets[-1]
                where = f"offset {first}" if first == last else f"offsets {first}-{last}"
                click.echo(f"sent {len(r.offsets)} to queue {r.queue} ({r.broker}), {where}")
    if g.json:
        output.emit_json({"topic": topic, "sent": sent})


def message_json(m: ReceivedMessage) -> dict[str, Any]:
    """A message as a JSON pull answers it (API.md), with its queue."""
    out: dict[str, Any] = {"queue": m.queue, "offset": m.offset, "ts": m.ts, "key": m.key, "props": dict(m.props)}
    if m.is_text:
        out["body"] = m.text
    else:
        out["body_b64"] = base64.b64encode(m.body).decode("ascii")
    return out


def message_line(m: ReceivedMessage) -> str:
    """One message for people: queue, offset, time, key, then the body (text as it is, with its line breaks shown
    as \\n; other bytes as base64:...)."""
    body = m.text.replace("\\", "\\\\").replace("\n", "\\n") if m.is_text else \
        "base64:" + base64.b64encode(m.body).decode("ascii")
    return "\t".join([str(m.queue), str(m.offset), output.when(m.ts) or "-", m.key if m.key is not None else "-",
                      body])


class _Shown:
    """Messages printed so far: each as a line (table) or kept for one JSON document (json), or a JSON line each
    while following."""

    def __init__(self, g: Globals, follow: bool):
        self.g, self.follow = g, follow
        self.kept: list[dict[str, Any]] = []
        self.count = 0

    def show(self, m: ReceivedMessage) -> None:
        self.count += 1
        if not self.g.json:
            if self.count == 1:
                click.echo("QUEUE\tOFFSET\tTIME\tKEY\tBODY")
            click.echo(message_line(m))
        elif self.follow:
            output.emit_json_line(message_json(m))
        else:
            self.kept.append(message_json(m))


@click.command("consume")
@click.argument("topic")
@click.option("--queue", "queues", type=click.IntRange(min=0), multiple=True,
              help="read this queue (repeatable; default: every queue, or the key's queue with --message-key)")
@click.option("--offset", type=click.IntRange(min=0), help="start at this offset of each queue read")
@click.option("--since", type=IsoTime(), help="start at the first message stored at or after this time")
@click.option("--group", help="start at this group's committed offsets (a queue it never committed: the oldest)")
@click.option("--commit", is_flag=True, help="with --group: commit the offset after the last message printed")
@click.option("--message-key", metavar="KEY", help="print only this key's messages")
@click.option("--max", "max_messages", type=click.IntRange(1, CONSUME_MAX), default=CONSUME_MAX_DEFAULT,
              show_default=True, help="stop after this many messages (without --follow)")
@click.option("--scan-max", type=click.IntRange(1, browse.SCAN_MESSAGES_MAX), default=browse.SCAN_MESSAGES_DEFAULT,
              show_default=True, help="with --message-key and without --follow: read at most this many messages "
                                      "of each queue")
@click.option("--follow", is_flag=True, help="wait for new messages and print them until interrupted; with "
                                             "-w json, one JSON document per line")
@global_options(stream_flag="follow")
async def consume(topic: str, queues: tuple[int, ...], offset: int | None, since: int | None, group: str | None,
                  commit: bool, message_key: str | None, max_messages: int, scan_max: int, follow: bool,
                  g: Globals) -> None:
    """Print TOPIC's messages: QUEUE, OFFSET, TIME, KEY and BODY per line (as kafka-console-consumer)."""
    if offset is not None and since is not None:
        raise CliError(INVALID_ARGUMENT, "give --offset or --since, not both")
    if commit and group is None:
        raise CliError(INVALID_ARGUMENT, "--commit needs --group")
    if since is not None and since < 0:
        raise CliError(INVALID_ARGUMENT, "--since: a time from 1970 on")
    async with PullConsumer(g.endpoints, g.need_token(), topic, group, ssl_context=g.ssl_context,
                            max_messages=PULL_MESSAGES_MAX) as consumer:
        route = await consumer.routes.get(topic)
        count = len(route["queues"])
        bad = [q for q in queues if q >= count]
        if bad:
            raise CliError(INVALID_ARGUMENT, f"queue {bad[0]} does not exist; {topic!r} has {count} queues "
                                             f"(0-{count - 1})")
        read = sorted(set(queues)) or ([queue_for_key(route, message_key)] if message_key is not None
                                       else list(range(count)))
        for q in read:
            if offset is not None:
                consumer.seek(q, offset)
            elif since is not None:
                consumer.seek(q, await consumer.offset_for_time(q, since // 1000))
        shown = _Shown(g, follow)
        if message_key is not None and not follow:
            await _search(consumer, read, message_key, max_messages, scan_max, shown)
        else:
            await _read(consumer, read, message_key, max_messages, follow, shown)
        if commit:
            await consumer.commit_positions()
        if g.json and not follow:
            output.emit_json({"topic": topic, "messages": shown.kept,
                              "next_offsets": {str(q): await consumer.position(q) for q in read}})


def _pull(consumer: PullConsumer, queue: int) -> browse.Pull:
    return lambda offset, n: consumer.pull(queue, offset, n)


async def _read(consumer: PullConsumer, queues: list[int], key: str | None, max_messages: int, follow: bool,
                shown: _Shown) -> None:
    """Each queue from its position, oldest queue first, until --max (or, following, until interrupted)."""
    while True:
        took = 0
        for q in queues:
            r = await consumer.pull(q)
            for m in r.messages:
                if not follow and shown.count >= max_messages:
                    return
                consumer.seek(q, m.offset + 1)
                if key is None or m.key == key:
                    shown.show(m)
            took += len(r.messages)
            if not r.messages:
                consumer.seek(q, r.next_offset)
        if not follow and (took == 0 or shown.count >= max_messages):
            return
        if took == 0:
            await asyncio.sleep(FOLLOW_IDLE_S)


async def _search(consumer: PullConsumer, queues: list[int], key: str, max_messages: int, scan_max: int,
                  shown: _Shown) -> None:
    for q in queues:
        found = await browse.find_key(_pull(consumer, q), key, await consumer.position(q), scan_max,
                                      min(browse.FOUND_MAX, max_messages - shown.count))
        for m in found.messages:
            shown.show(m)
        consumer.seek(q, found.next_offset)
        if not found.at_end:
            click.echo(f"queue {q}: read {found.scanned} messages up to offset {found.next_offset}, not to the "
                       f"end; go on with --queue {q} --offset {found.next_offset}", err=True)
        if shown.count >= max_messages:
            return
