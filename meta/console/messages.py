"""The console's Messages pages: a queue's messages from an offset, the newest, by key or from a time; a test message
sent (admin); and a group's dead letters on every broker.

Messages are data, held by brokers (DESIGN.md invariant 4): each read is a call to the broker heading the queue, with
the session's token, as ``stator consume`` makes through the client library; the searches are the library's own
(client/browse.py: by key a bounded scan); by time is the broker's own answer from its time index. The pages do not
follow the log as the others do: a scan is not repeated each time the log moves.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
from aiohttp import web

from client import browse
from client.consumer import PullResult, ReceivedMessage, pull_result
from client.slots import queue_for_key
from wire.caller import Answer
from wire.errors import invalid
from wire.params import PULL_MESSAGES_MAX
from wire.times import parse_iso

from .pages import (FLASH_CHARS_MAX, MEMBER_TIMEOUT_S, SESSION, ApiCallFailed, NodeApi, checked_form,
                    console_page, flash_of, form_error_of, name_param, refusals_on_the_form, render, whole_param)

SHOWN_DEFAULT = 20               # messages a page shows
SHOWN_MAX = 200
BODY_SHOWN_CHARS = 1_000         # a longer body is cut on the page, its size shown
KEY_CHARS_MAX = 1_024            # a key searched for
TEST_BODY_BYTES_MAX = 64 * 1024  # a test message's body from the form
BROKER_READ_TIMEOUT_S = 5.0      # one read of the queue's head broker
DEAD_LETTERS_SHOWN_MAX = 200     # per broker


def _page(api: NodeApi, address: str, topic: str, queue: int):
    """A browse.Pull over the head broker's ``GET /v1/messages`` (JSON), made with the session's token."""
    async def pull(offset: int, n: int) -> PullResult:
        path = f"/v1/messages/{quote(topic, safe='')}/{queue}?offset={offset}&max={min(n, PULL_MESSAGES_MAX)}"
        status, body = await api.call("GET", path, base=address, timeout_s=BROKER_READ_TIMEOUT_S)
        if status != 200:
            raise ApiCallFailed(f"GET {address}{path}", status, body)
        api.calls[f"GET {address}{path}"] = body   # the page names every read it made (a search makes several)
        return pull_result(topic, queue, offset, Answer(status, body, {}, address + path))
    return pull


def _shown(m: ReceivedMessage) -> dict[str, Any]:
    if m.is_text:
        text, form = m.text, "text"
    else:
        text, form = base64.b64encode(m.body[:BODY_SHOWN_CHARS]).decode("ascii"), "base64"
    return {"offset": m.offset, "ts": m.ts, "key": m.key, "props": dict(m.props), "size": len(m.body), "form": form,
            "body": text[:BODY_SHOWN_CHARS], "cut": len(text) > BODY_SHOWN_CHARS}


def _query_time(raw: str) -> int | None:
    """ms since the epoch of the form's time (ISO-8601, UTC when it names no offset)."""
    if not raw:
        return None
    try:
        return parse_iso(raw) // 1000
    except ValueError as e:
        raise invalid(str(e)) from None


@console_page()
async def messages_page(request: web.Request) -> web.Response:
    """``?queue=&offset=``: from an offset; ``?key=``: that key's messages (its queue unless one is named), scanning
    from ``offset`` (default the oldest) at most browse.SCAN_MESSAGES_DEFAULT; ``?since=``: from the first message
    stored at or after a time; nothing: the newest."""
    api = NodeApi(request, request[SESSION])
    topic = name_param(request.match_info["topic"])
    q = request.query
    route = await api.get(f"/v1/routes/{quote(topic)}")
    count = len(route["queues"])
    key = q.get("key", "")
    if len(key) > KEY_CHARS_MAX:
        raise invalid(f"a key of at most {KEY_CHARS_MAX} characters")
    queue = whole_param(q.get("queue"), queue_for_key(route, key) if key else 0)
    if queue >= count:
        raise invalid(f"queue {queue} does not exist; {topic!r} has {count} queues")
    shown_max = max(1, min(whole_param(q.get("max"), SHOWN_DEFAULT), SHOWN_MAX))
    since = _query_time(q.get("since", "").strip())
    head = route["queues"][queue]
    if not head.get("address"):
        raise invalid(f"queue {queue} of {topic!r} has no broker with an address in the route")
    pull = _page(api, head["address"].rstrip("/"), topic, queue)
    bounds = await browse.bounds(pull)
    offset = whole_param(q.get("offset"), -1)
    search: browse.KeySearch | None = None
    if key:
        search = await browse.find_key(pull, key, max(offset, bounds.min_offset), found_max=shown_max)
        messages, next_offset = search.messages, search.next_offset
    else:
        if since is not None:   # the broker's own answer, from each segment's time index
            path = f"/v1/queues/{quote(topic, safe='')}/{queue}/offset?ts={since}"
            found = await api.get(path, base=head["address"].rstrip("/"), timeout_s=BROKER_READ_TIMEOUT_S)
            offset = found["offset"]
        elif offset < 0:
            offset = max(bounds.min_offset, bounds.max_offset - shown_max)   # the newest
        r = await pull(offset, shown_max)
        messages, next_offset = r.messages, r.next_offset
    base = f"/console/topics/{quote(topic)}/messages"

    def link(**params: Any) -> str:
        return base + "?" + urlencode({"queue": queue, "max": shown_max, **params})
    older = link(offset=max(bounds.min_offset, offset - shown_max)) if not key and offset > bounds.min_offset else None
    newer = link(offset=next_offset) if not key and next_offset < bounds.max_offset else None
    go_on = link(key=key, offset=next_offset) if search is not None and not search.at_end else None
    return render(request, "messages.html", api, topic=topic, queues=count, queue=queue, key=key,
                  since=q.get("since", ""), offset=offset, offset_asked=q.get("offset", ""), shown_max=shown_max,
                  bounds=bounds, messages=[_shown(m) for m in messages], search=search, older=older, newer=newer,
                  go_on=go_on, broker=head.get("broker"), no_live=True, flash=flash_of(request),
                  form_error=form_error_of(request), key_chars_max=KEY_CHARS_MAX)


@console_page("admin")
async def send_test_message(request: web.Request) -> web.Response:
    """The Messages page's form: one message (text, an optional key) to the queue's head broker; back to the page
    at its offset."""
    form = await checked_form(request)
    topic = name_param(request.match_info["topic"])
    page = f"/console/topics/{quote(topic)}/messages"
    with refusals_on_the_form(request, page):
        api = NodeApi(request, request[SESSION])
        route = await api.get(f"/v1/routes/{quote(topic)}")
        body = str(form.get("body", ""))
        key = str(form.get("key", "")).strip()
        if len(body.encode()) > TEST_BODY_BYTES_MAX:
            raise invalid(f"a test message of at most {TEST_BODY_BYTES_MAX} bytes")
        if len(key) > KEY_CHARS_MAX:
            raise invalid(f"a key of at most {KEY_CHARS_MAX} characters")
        queue = whole_param(str(form.get("queue", "")).strip() or None, queue_for_key(route, key) if key else 0)
        if queue >= len(route["queues"]):
            raise invalid(f"queue {queue} does not exist; {topic!r} has {len(route['queues'])} queues")
        address = route["queues"][queue].get("address")
        if not address or not route["queues"][queue].get("writable"):
            raise invalid(f"queue {queue} takes no writes now (its broker is being remapped or is down)")
        message: dict[str, Any] = {"body": body, **({"key": key} if key else {})}
        path = f"/v1/messages/{quote(topic, safe='')}/{queue}"
        status, answer = await api.call("POST", path, json_body={"messages": [message]}, base=address.rstrip("/"),
                                        timeout_s=BROKER_READ_TIMEOUT_S)
        if status != 200:
            raise ApiCallFailed(f"POST {address}{path}", status, answer)
    offset = answer["offsets"][0]
    flash = f"sent to queue {queue} at offset {offset}"
    raise web.HTTPSeeOther(f"{page}?{urlencode({'queue': queue, 'offset': offset, 'flash': flash[:FLASH_CHARS_MAX]})}")


@console_page()
async def dead_letters_page(request: web.Request) -> web.Response:
    """A pop group's dead-letter queue on every active broker (each broker keeps the dead letters of the queues it
    served: ``GET /v1/dlq/{group}``)."""
    api = NodeApi(request, request[SESSION])
    group = name_param(request.match_info["group"])
    brokers = (await api.get("/v1/brokers"))["brokers"]
    offset = whole_param(request.query.get("offset"), 0)

    async def one(b: dict[str, Any]) -> dict[str, Any]:
        if b["state"] != "active" or not b.get("address"):
            return {"broker": b["broker"], "error": b["state"]}
        try:
            got = await api.get(f"/v1/dlq/{quote(group)}?offset={offset}&max={DEAD_LETTERS_SHOWN_MAX}",
                                base=b["address"], timeout_s=MEMBER_TIMEOUT_S)
        except (ApiCallFailed, aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            return {"broker": b["broker"], "error": str(e) or type(e).__name__}
        return {"broker": b["broker"], "messages": got["messages"], "next_offset": got["next_offset"]}
    found = await asyncio.gather(*(one(b) for b in brokers))
    return render(request, "dead_letters.html", api, group=group, brokers=found, offset=offset, no_live=True)


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/console/topics/{topic}/messages", messages_page)
    r.add_post("/console/topics/{topic}/messages", send_test_message)
    r.add_get("/console/groups/{group}/dead-letters", dead_letters_page)
