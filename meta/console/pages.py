"""The web console's pages: server-rendered HTML over the node's own API, live through one SSE stream.

Every page is the rendering of one or a few API calls that the node makes to itself with the logged-in session's
token (sessions.py), so the console shows exactly what the API answers and checks exactly what the API checks;
``?format=json`` answers those calls' bodies, and each page names the calls it shows. ``?fragment=1`` answers only
the page's content: console.js fetches it whenever ``/console/events`` says the log moved, so pages change in place
without a reload.

Authentication: the API's middleware sees every console route as public (``@public``) and ``console_page`` checks
the session cookie instead; a page without a session redirects to the login form, a JSON or fragment request gets
401. Forms (remap, group settings) carry the session's CSRF token and need the admin role.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import jinja2
from aiohttp import web

from wire.errors import ApiError, invalid
from runtime.server import public, role_of

from .. import limits
from ..api.http import service
from ..api.keys import ADMISSIONS
from wire.names import NAME_RE
from ..changefeed import ANY
from . import timeline as timeline_mod
from . import values
from .sessions import COOKIE, CONSOLE_ROLES, Session, Sessions, csrf_ok

SESSIONS = web.AppKey("console_sessions", Sessions)
SESSION = "console_session"     # request key: the Session of this request
DRAWN_AT = "console_drawn_at"   # request key: the version this node had applied when the page's calls began
HERE = Path(__file__).parent
TEMPLATES = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True)
values.register(TEMPLATES.filters)
CALL_TIMEOUT_S = 10.0           # one API call of a page (a history page of 10,000 events included)
MEMBER_TIMEOUT_S = 2.0          # the cluster page asks each member how it sees itself: a dead one costs this
TIMELINE_EVENTS_MAX = 20_000    # events one timeline draws (two history pages)
HISTORY_SHOWN_MAX = 500         # events one history page shows
EVENTS_KEEPALIVE_S = 15.0
POLL_MS = 1_000                 # pages whose content changes outside the log (health, heartbeats) refetch this often
BROKERS_PROBED_MAX = 200        # the brokers page asks at most this many brokers whether they are up, at once
GROUPS_LAGGED_MAX = 50          # the groups page shows the lag of this many groups (one describe each)
GROUP_DESCRIBES_IN_FLIGHT_MAX = 8
FLASH_CHARS_MAX = 200         # the outcome line a form's redirect carries back to its page
NAME_CHARS_MAX = 255          # a topic or group name in a console path (the API has its own, tighter bounds)


class ApiCallFailed(Exception):
    def __init__(self, call: str, status: int, body: Any):
        err = body.get("error", {}) if isinstance(body, dict) else {}
        super().__init__(f"{call}: {err.get('code', status)}: {err.get('message', body)}")
        self.status = status
        self.code = err.get("code")


class NodeApi:
    """The API calls of one page, made to this node with the session's token and kept for ``?format=json``."""

    def __init__(self, request: web.Request, session: Session):
        svc = service(request)
        self._http = svc.forwarder.http_session()
        self._base = next(m.url for m in svc.config.members if m.node == svc.config.node).rstrip("/")
        self._headers = {"Authorization": f"Bearer {session.token}"}
        self.calls: dict[str, Any] = {}

    async def get(self, path: str, base: str | None = None, timeout_s: float = CALL_TIMEOUT_S,
                  keep: bool = True) -> Any:
        status, body = await self.call("GET", path, base=base, timeout_s=timeout_s)
        if status != 200:
            raise ApiCallFailed(f"GET {path}", status, body)
        if keep:
            self.calls[f"GET {path}" if base is None else f"GET {base}{path}"] = body
        return body

    async def call(self, method: str, path: str, json_body: Any = None, base: str | None = None,
                   timeout_s: float = CALL_TIMEOUT_S, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        url = (base or self._base).rstrip("/") + path
        async with self._http.request(method, url, json=json_body, headers={**self._headers, **(headers or {})},
                                      timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            text = await r.text()
        try:
            return r.status, json.loads(text) if text else None
        except ValueError:
            return r.status, text


def console_page(role: str = "client"):
    """The handler needs a console session of ``role`` (admin may do everything)."""
    def wrap(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        @public   # for the API middleware: the console authenticates by its own cookie, here
        @functools.wraps(handler)
        async def checked(request: web.Request) -> web.StreamResponse:
            session = request.app[SESSIONS].get(request.cookies.get(COOKIE))
            if session is None:
                if _wants_page(request):
                    raise web.HTTPSeeOther("/console/login?next=" + quote(request.path, safe="/"))
                raise ApiError("log in to the console first: POST /console/login", code="UNAUTHENTICATED", status=401)
            if role == "admin" and session.role != "admin":
                return _error_page(request, session, 403, "this needs the admin token")
            request[SESSION] = session
            # The page shows this version at least: its event stream starts from it (console.js), and a form's
            # redirect names the version of its change (?min_version=), which the page waits for like any read
            svc = service(request)
            if request.query.get("min_version") is not None:
                try:
                    await svc.reads.before_read({"min_version": request.query["min_version"]})
                except ApiError as e:
                    return _error_page(request, session, e.status, f"{e.code}: {e.message}")
            request[DRAWN_AT] = svc.feed.version
            try:
                return await handler(request)
            except ApiCallFailed as e:
                return _error_page(request, session, e.status if 400 <= e.status < 600 else 502, str(e))
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                return _error_page(request, session, 502, f"this node did not answer its own API: {e!r}")
        return checked
    return wrap


def _wants_page(request: web.Request) -> bool:
    """A person's page load (else a script's call: the event stream, a fragment, JSON or a form's POST)."""
    return (request.method == "GET" and request.path != "/console/events"
            and request.query.get("format") != "json" and request.query.get("fragment") != "1")


def render(request: web.Request, template: str, api: NodeApi, **context: Any) -> web.Response:
    if request.query.get("format") == "json":
        return web.json_response({"api": api.calls})
    session: Session = request[SESSION]
    html = TEMPLATES.get_template(template).render(
        fragment=request.query.get("fragment") == "1", role=session.role, csrf=session.csrf,
        node=service(request).config.node, path=request.path, calls=list(api.calls),
        drawn_at=request.get(DRAWN_AT, 0), **context)
    return web.Response(text=html, content_type="text/html", headers=_NO_STORE)


_NO_STORE = {"Cache-Control": "no-store"}


def _error_page(request: web.Request, session: Session, status: int, message: str) -> web.Response:
    if request.query.get("format") == "json":
        code = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND"}.get(status, "UNAVAILABLE")
        return web.json_response({"error": {"code": code, "message": message, "details": {}}}, status=status)
    html = TEMPLATES.get_template("error.html").render(
        fragment=request.query.get("fragment") == "1", role=session.role, csrf=session.csrf,
        node=service(request).config.node, path=request.path, calls=[], status=status, message=message)
    return web.Response(text=html, status=status, content_type="text/html", headers=_NO_STORE)


# -- login ------------------------------------------------------------------------------------------------------
@public
async def login_form(request: web.Request) -> web.Response:
    html = TEMPLATES.get_template("login.html").render(fragment=False, role=None, node=service(request).config.node,
                                                       path=request.path, calls=[], failed=False,
                                                       next=_safe_next(request.query.get("next")))
    return web.Response(text=html, content_type="text/html", headers=_NO_STORE)


@public
async def login(request: web.Request) -> web.Response:
    if request.content_type not in ("application/x-www-form-urlencoded", "multipart/form-data"):
        raise invalid("the console's login takes a form with the token (application/x-www-form-urlencoded)")
    form = await request.post()
    token = str(form.get("token", "")).strip()
    role = role_of(token, service(request).config.tokens.by_role()) if token else None
    if role not in CONSOLE_ROLES:
        html = TEMPLATES.get_template("login.html").render(fragment=False, role=None, path=request.path, calls=[],
                                                           node=service(request).config.node, failed=True,
                                                           next=_safe_next(str(form.get("next", ""))))
        return web.Response(text=html, status=401, content_type="text/html", headers=_NO_STORE)
    sid = request.app[SESSIONS].open(role, token)
    resp = web.HTTPSeeOther(_safe_next(str(form.get("next", ""))))
    resp.set_cookie(COOKIE, sid, path="/console", httponly=True, samesite="Strict", secure=request.secure)
    raise resp


def _stale_form() -> ApiError:
    return ApiError("the form's CSRF token is not this session's: reload the page", code="PERMISSION_DENIED",
                    status=403)


def _safe_next(value: str | None) -> str:
    """Only a console path of this node: never another site (an open redirect) or a scheme."""
    if value and value.startswith("/console") and "//" not in value and "\\" not in value:
        return value
    return "/console"


@console_page()
async def logout(request: web.Request) -> web.Response:
    await checked_form(request)
    request.app[SESSIONS].close(request.cookies.get(COOKIE))
    resp = web.HTTPSeeOther("/console/login")
    resp.del_cookie(COOKIE, path="/console")
    raise resp


# -- live updates -----------------------------------------------------------------------------------------------
@console_page()
async def events(request: web.Request) -> web.StreamResponse:
    """``change`` (id and data: the applied version) whenever this node applies a version: pages refetch their
    content. The first comes at once when this node applied more than ``?after=`` (the version the page was drawn
    at) or than ``Last-Event-ID`` (the browser's reconnect). Counted among the node's watch streams, with their
    bound."""
    svc = service(request)
    after = request.headers.get("Last-Event-ID") or request.query.get("after")
    after = min(whole_param(after, svc.feed.version), svc.feed.version)
    admission = request.app[ADMISSIONS]["watch_streams"]
    admission.enter()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no"})
    try:
        await resp.prepare(request)
        sent = after
        await resp.write(b"retry: 2000\n\n")
        while True:
            if svc.feed.version > sent:
                sent = svc.feed.version
                await resp.write(b"event: change\nid: %d\ndata: %d\n\n" % (sent, sent))
            elif not await svc.feed.wait(ANY, EVENTS_KEEPALIVE_S):
                await resp.write(b": keepalive\n\n")
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        admission.leave()
    return resp


# -- pages ------------------------------------------------------------------------------------------------------
@console_page()
async def cluster_page(request: web.Request) -> web.Response:
    api = NodeApi(request, request[SESSION])
    here = await api.get("/v1/cluster")
    members = await asyncio.gather(*(_member(api, m) for m in here["members"]))
    applied = [m["applied_version"] for m in members if m.get("applied_version") is not None]
    newest = max(applied, default=None)
    for m in members:
        m["behind"] = newest - m["applied_version"] if m.get("applied_version") is not None else None
    return render(request, "cluster.html", api, here=here, members=members, poll_ms=POLL_MS)


async def _member(api: NodeApi, member: dict[str, Any]) -> dict[str, Any]:
    """How a member sees itself (its own /v1/cluster and /readyz), or why it could not say."""
    out = {"node": member["node"], "url": member.get("url"), "voter": member.get("voter")}
    if not member.get("url"):
        return {**out, "error": "no URL known"}
    try:
        status, body = await api.call("GET", "/v1/cluster", base=member["url"], timeout_s=MEMBER_TIMEOUT_S)
        ready, _ = await api.call("GET", "/readyz", base=member["url"], timeout_s=MEMBER_TIMEOUT_S)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        return {**out, "error": f"unreachable ({_why_unreachable(e)})"}
    if status != 200:
        return {**out, "error": f"answered {status}"}
    api.calls[f"GET {member['url']}/v1/cluster"] = body
    return {**out, "role": body.get("role"), "term": body.get("term"), "commit_index": body.get("commit_index"),
            "applied_version": body.get("applied_version"), "ready": ready == 200}


@console_page()
async def brokers_page(request: web.Request) -> web.Response:
    api = NodeApi(request, request[SESSION])
    brokers = (await api.get("/v1/brokers?include=heads"))["brokers"]
    now_ms = int(time.time() * 1000)
    up = await asyncio.gather(*(_broker_up(api, b) for b in brokers[:BROKERS_PROBED_MAX]))
    return render(request, "brokers.html", api, brokers=brokers, now_ms=now_ms, poll_ms=POLL_MS,
                  up=dict(zip((b["broker"] for b in brokers), up)))


async def _broker_up(api: NodeApi, broker: dict[str, Any]) -> str:
    """Whether a broker answers at all (its /readyz, any status): a killed one is down at once, long before its
    session lapses and meta fences it."""
    if not broker.get("address"):
        return "no address"
    try:
        await api.call("GET", "/readyz", base=broker["address"], timeout_s=MEMBER_TIMEOUT_S)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        return f"down ({_why_unreachable(e)})"
    return "up"


def _why_unreachable(e: BaseException) -> str:
    """Why a member did not answer, in a person's words (not an exception's class name)."""
    if isinstance(e, asyncio.TimeoutError):
        return f"no answer in {MEMBER_TIMEOUT_S:g} s"
    if isinstance(e, aiohttp.ClientConnectorError):
        return "connection refused" if isinstance(e.os_error, ConnectionRefusedError) else "cannot connect"
    return "connection lost"


@console_page()
async def topics_page(request: web.Request) -> web.Response:
    api = NodeApi(request, request[SESSION])
    topics = (await api.get("/v1/topics"))["topics"]
    brokers = (await api.get("/v1/brokers"))["brokers"] if request[SESSION].role == "admin" else []
    return render(request, "topics.html", api, topics=topics, brokers=brokers, flash=flash_of(request),
                  form_error=form_error_of(request), form=request.query.get("form", ""))


@console_page()
async def groups_page(request: web.Request) -> web.Response:
    """Every group, with the groups only brokers know (a pull group commits offsets there and never joins through
    meta), and each group's lag: the sum over its queues of what ``GET /v1/groups/{group}`` answers (the brokers
    count it), for the first GROUPS_LAGGED_MAX groups."""
    api = NodeApi(request, request[SESSION])
    groups = (await api.get("/v1/groups?include=brokers"))["groups"]
    gate = asyncio.Semaphore(GROUP_DESCRIBES_IN_FLIGHT_MAX)

    async def lag_of(name: str) -> tuple[str, int | None]:
        async with gate:
            try:
                d = await api.get(f"/v1/groups/{quote(name)}", timeout_s=MEMBER_TIMEOUT_S * 2)
            except (ApiCallFailed, aiohttp.ClientError, asyncio.TimeoutError, OSError):
                return name, None
        lags = {(r.get("topic"), r.get("queue")): r.get("lag") for r in [*d.get("assignments", []),
                                                                          *d.get("offsets", [])]}
        known = [v for v in lags.values() if isinstance(v, int) and not isinstance(v, bool)]
        return name, sum(known) if known else None
    lags = dict(await asyncio.gather(*(lag_of(g["group"]) for g in groups[:GROUPS_LAGGED_MAX])))
    return render(request, "groups.html", api, groups=groups, lags=lags, lagged_max=GROUPS_LAGGED_MAX)


@console_page()
async def topic_page(request: web.Request) -> web.Response:
    api = NodeApi(request, request[SESSION])
    topic = name_param(request.match_info["topic"])
    detail = await api.get(f"/v1/topics/{quote(topic)}")
    brokers = (await api.get("/v1/brokers"))["brokers"]
    # Whether each queue takes writes, as producers are told: a head on a fenced broker does not, though its
    # segment is still "active" in the topic
    route = await api.get(f"/v1/routes/{quote(topic)}")
    writable = {q["queue"]: q["writable"] for q in route["queues"]}
    return render(request, "topic.html", api, t=detail, brokers=brokers, writable=writable,
                  held=await _queue_ranges(api, topic, route), last_hour=await _last_hour(api, topic, brokers),
                  flash=flash_of(request), form_error=form_error_of(request), form=request.query.get("form", ""))


async def _last_hour(api: NodeApi, topic: str, brokers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The topic's messages stored and served per minute over the last hour, summed over the active brokers that
    answer (``GET /v1/rates/{topic}``, broker/rates.py); None when none does. Buckets are wall-clock minutes on
    every broker: a bucket of another minute (a broker's clock apart) is left out."""
    addresses = [b["address"] for b in brokers if b["state"] == "active" and b.get("address")]
    if not addresses or len(addresses) > BROKERS_PROBED_MAX:
        return None

    async def one(address: str) -> dict[str, Any] | None:
        try:
            return await api.get(f"/v1/rates/{quote(topic)}", base=address, timeout_s=MEMBER_TIMEOUT_S)
        except (ApiCallFailed, aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return None
    answers = [a for a in await asyncio.gather(*(one(a) for a in addresses)) if a]
    if not answers:
        return None
    minute = max(a["minute_ms"] for a in answers)
    same = [a for a in answers if a["minute_ms"] == minute]
    stored = [sum(col) for col in zip(*(a["stored"] for a in same))]
    served = [sum(col) for col in zip(*(a["served"] for a in same))]
    return {"minute_ms": minute, "stored": stored, "served": served, "brokers": len(same),
            "charts": [("sent", "stored", stored), ("consumed", "served", served)]}


async def _queue_ranges(api: NodeApi, topic: str, route: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Each queue's min and max offsets and the messages it stores, from the broker heading it (one call per
    broker: ``GET /v1/queues/{topic}?count=1``); a broker that does not answer in MEMBER_TIMEOUT_S leaves its queues
    out."""
    addresses = {q["address"].rstrip("/") for q in route["queues"] if q.get("address")}
    if len(addresses) > BROKERS_PROBED_MAX:
        return {}

    async def one(address: str) -> list[dict[str, Any]]:
        try:
            return (await api.get(f"/v1/queues/{quote(topic)}?count=1", base=address,
                                  timeout_s=MEMBER_TIMEOUT_S))["queues"]
        except (ApiCallFailed, aiohttp.ClientError, asyncio.TimeoutError, OSError, KeyError, TypeError):
            return []
    return {q["queue"]: q for rows in await asyncio.gather(*(one(a) for a in sorted(addresses))) for q in rows}


@console_page("admin")
async def remap(request: web.Request) -> web.Response:
    """The topic page's remap form: POST /v1/topics/{topic}/remap with the chosen brokers (and queues)."""
    form = await checked_form(request)
    topic = name_param(request.match_info["topic"])
    page = f"/console/topics/{quote(topic)}"
    with refusals_on_the_form(request, page):
        body: dict[str, Any] = {"brokers": [str(b) for b in form.getall("brokers", [])]}
        if not body["brokers"]:
            raise invalid("choose at least one broker to move the queues to")
        queues = str(form.get("queues", "")).strip()
        if queues:
            try:
                body["queues"] = [int(q) for q in queues.replace(",", " ").split()]
            except ValueError:
                raise invalid(f"queues: {queues!r} is not a list of queue numbers") from None
        answer = await submit_change(request, "POST", f"/v1/topics/{quote(topic)}/remap", body)
    moved = ", ".join(f"q{m['queue']} {m['from']}→{m['to']}" for m in answer.get("moved", [])) or "nothing moved"
    back_to(page, f"remap at v{answer['version']}: {moved}", answer["version"])


@contextlib.contextmanager
def refusals_on_the_form(request: web.Request, page: str) -> Iterator[None]:
    """A form a person submitted (the browser asks for HTML) that the console or the API refuses goes back to its
    page with the refusal shown on the form, instead of a bare error page that loses the page; a script's POST
    keeps the API's error as it is."""
    try:
        yield
    except (ApiError, ApiCallFailed) as e:
        if "text/html" not in request.headers.get("Accept", ""):
            raise
        said = f"{e.code}: {e.message}" if isinstance(e, ApiError) else str(e)
        joint = "&" if "?" in page else "?"
        raise web.HTTPSeeOther(f"{page}{joint}form_error={quote(said[:FLASH_CHARS_MAX])}") from None


async def checked_form(request: web.Request):
    form = await request.post()
    if not csrf_ok(request[SESSION], form.get("csrf")):
        raise _stale_form()
    return form


async def submit_change(request: web.Request, method: str, path: str,
                        body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One change through the node's API, once (an idempotency key: a retried form applies nothing twice)."""
    status, answer = await NodeApi(request, request[SESSION]).call(
        method, path, json_body=body, headers={"Idempotency-Key": secrets.token_hex(16)})
    if status not in (200, 201):
        raise ApiCallFailed(f"{method} {path}", status, answer)
    return answer


def back_to(page: str, flash: str, version: int) -> None:
    """To ``page``, drawn once this node applied the form's change (a follower may not have yet)."""
    raise web.HTTPSeeOther(f"{page}?flash={quote(flash[:FLASH_CHARS_MAX])}&min_version={version}")


def flash_of(request: web.Request) -> str:
    return request.query.get("flash", "")[:FLASH_CHARS_MAX]


def form_error_of(request: web.Request) -> str:
    return request.query.get("form_error", "")[:FLASH_CHARS_MAX]


@console_page()
async def timeline_page(request: web.Request) -> web.Response:
    api = NodeApi(request, request[SESSION])
    topic = name_param(request.match_info["topic"])
    after = whole_param(request.query.get("after"), 0)
    events: list[dict[str, Any]] = []
    cursor = after
    while len(events) < TIMELINE_EVENTS_MAX:
        page = await api.get(f"/v1/history?topic={quote(topic)}&after={cursor}&limit={limits.HISTORY_PAGE_MAX}",
                             keep=False)
        events.extend(page["events"])
        if not page["events"] or page["next_after"] <= cursor:
            break
        cursor = page["next_after"]
    events = events[:TIMELINE_EVENTS_MAX]
    api.calls[f"GET /v1/history?topic={topic}&after={after}"] = {"events": len(events), "next_after": cursor}
    tl = timeline_mod.build(topic, events, int(time.time() * 1000))
    return render(request, "timeline.html", api, tl=tl, g=timeline_mod.Geometry(), after=after,
                  truncated=len(events) >= TIMELINE_EVENTS_MAX)


@console_page()
async def group_page(request: web.Request) -> web.Response:
    api = NodeApi(request, request[SESSION])
    group = name_param(request.match_info["group"])
    detail = await api.get(f"/v1/groups/{quote(group)}")
    return render(request, "group.html", api, g=detail, now_ms=int(time.time() * 1000),
                  flash=flash_of(request), form_error=form_error_of(request))


@console_page("admin")
async def group_config(request: web.Request) -> web.Response:
    form = await checked_form(request)
    group = name_param(request.match_info["group"])
    page = f"/console/groups/{quote(group)}"
    with refusals_on_the_form(request, page):
        body = {key: value for key in ("max_attempts", "lease_ms") if (value := form_whole(form, key)) is not None}
        answer = await submit_change(request, "PUT", f"/v1/groups/{quote(group)}/config", body)
    back_to(page, f"settings saved at v{answer['version']}", answer["version"])


@console_page()
async def pop_page(request: web.Request) -> web.Response:
    """The group's pop state on every active broker (pop state lives on brokers, not in the log)."""
    api = NodeApi(request, request[SESSION])
    group = name_param(request.match_info["group"])
    brokers = (await api.get("/v1/brokers"))["brokers"]

    async def one(b: dict[str, Any]) -> dict[str, Any]:
        if b["state"] != "active":
            return {"broker": b["broker"], "error": b["state"]}
        try:
            return await api.get(f"/v1/pop-stats/{quote(group)}", base=b["address"], timeout_s=MEMBER_TIMEOUT_S)
        except (ApiCallFailed, aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            return {"broker": b["broker"], "error": str(e) or type(e).__name__}
    stats = await asyncio.gather(*(one(b) for b in brokers))
    return render(request, "pop.html", api, group=group, stats=stats)


@console_page()
async def history_page(request: web.Request) -> web.Response:
    api = NodeApi(request, request[SESSION])
    topic = request.query.get("topic", "").strip()
    kind = request.query.get("type", "").strip()
    after = whole_param(request.query.get("after"), 0)
    limit = max(1, min(whole_param(request.query.get("limit"), 100), HISTORY_SHOWN_MAX))
    path = f"/v1/history?after={after}&limit={limit}" + (f"&topic={quote(name_param(topic))}" if topic else "")
    page = await api.get(path)
    shown = [e for e in page["events"] if not kind or e["type"] == kind]
    return render(request, "history.html", api, events=shown, topic=topic, kind=kind, after=after, limit=limit,
                  next_after=page["next_after"], json=lambda d: json.dumps(d, sort_keys=True))


def name_param(value: str) -> str:
    if len(value) > NAME_CHARS_MAX or not NAME_RE.fullmatch(value):
        raise invalid(f"not a valid name: {value[:100]!r}")
    return value


def form_whole(form: Any, key: str, required: bool = False) -> int | None:
    """A form's field as a whole number; None when left empty (INVALID_ARGUMENT when ``required``)."""
    raw = str(form.get(key, "")).strip()
    if not raw:
        if required:
            raise invalid(f"{key} is required")
        return None
    try:
        return int(raw)
    except ValueError:
        raise invalid(f"{key}: {raw[:30]!r} is not a whole number") from None


def whole_param(value: str | None, default: int) -> int:
    try:
        return max(0, int(value)) if value not in (None, "") else default
    except ValueError:
        raise invalid(f"not a whole number: {value[:30]!r}") from None


@public
async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in STATIC_FILES:
        raise ApiError(f"no console file {name[:100]!r}", code="NOT_FOUND", status=404)
    return web.Response(body=STATIC_FILES[name][1], content_type=STATIC_FILES[name][0],
                        headers={"Cache-Control": "max-age=300"})


STATIC_FILES = {name: (kind, (HERE / "static" / name).read_bytes())
                for name, kind in (("console.js", "application/javascript"), ("console.css", "text/css"))}


def add_routes(app: web.Application) -> None:
    app[SESSIONS] = Sessions()
    r = app.router
    r.add_get("/console", cluster_page)
    r.add_get("/console/login", login_form)
    r.add_post("/console/login", login)
    r.add_post("/console/logout", logout)
    r.add_get("/console/events", events)
    r.add_get("/console/brokers", brokers_page)
    r.add_get("/console/topics", topics_page)
    r.add_get("/console/topics/{topic}", topic_page)
    r.add_post("/console/topics/{topic}/remap", remap)
    r.add_get("/console/topics/{topic}/timeline", timeline_page)
    r.add_get("/console/groups", groups_page)
    r.add_get("/console/groups/{group}", group_page)
    r.add_post("/console/groups/{group}/config", group_config)
    r.add_get("/console/groups/{group}/pop", pop_page)
    r.add_get("/console/history", history_page)
    r.add_get("/console/static/{name}", static)
