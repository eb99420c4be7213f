"""JSON over aiohttp: one bounded request (``request_once``), backoff with jitter, and ``MetaCaller``, which fails over
across the meta nodes.

Every request has a timeout; every retry loop has both a maximum number of attempts and a total deadline. A retry of
a meta mutation is safe only because the caller (``AdminClient``) sends the same ``Idempotency-Key`` on every attempt;
``MetaCaller`` itself never invents one.
"""

from __future__ import annotations

import asyncio
import json as jsonlib
import random
import ssl
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from wire import tls
from wire.errors import Closed, StatorError, Unavailable, VersionHeaders

REQUEST_TIMEOUT_S_DEFAULT = 12.0    # a meta write may wait up to 5 s for a proposal, plus forwarding to the leader
CONNECT_TIMEOUT_S_DEFAULT = 3.0
META_ATTEMPTS_MAX_DEFAULT = 8
META_DEADLINE_S_DEFAULT = 30.0
BACKOFF_BASE_S_DEFAULT = 0.05
BACKOFF_CAP_S_DEFAULT = 1.0
ERROR_TEXT_CHARS_MAX = 500

# What aiohttp raises when there is no (complete) answer. ClientResponseError is absent on purpose: we never
# call raise_for_status, and a status is an answer.
TRANSPORT_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError, OSError)


@dataclass(frozen=True)
class Answer(VersionHeaders):
    """One HTTP answer: status, parsed JSON body (None when empty; bytes for a ``raw_answer``), headers, and the URL
    that answered."""
    status: int
    body: Any
    headers: Mapping[str, str]
    url: str



class Backoff:
    """Exponential backoff with "equal jitter": attempt n waits between half and all of min(cap, base * 2**n).
    ``jitter=False``: attempt n waits exactly min(cap, base * 2**n)."""

    def __init__(self, base_s: float = BACKOFF_BASE_S_DEFAULT, cap_s: float = BACKOFF_CAP_S_DEFAULT,
                 rng: Callable[[], float] = random.random, *, jitter: bool = True):
        assert 0 < base_s <= cap_s
        self.base_s = base_s
        self.cap_s = cap_s
        self.jitter = jitter
        self._rng = rng

    def delay_s(self, attempt: int) -> float:
        ceiling = min(self.cap_s, self.base_s * (2 ** min(attempt, 30)))
        return ceiling * (0.5 + 0.5 * self._rng()) if self.jitter else ceiling


class Deadline:
    """A point in the event loop's time; ``left_s()`` never goes below zero."""

    def __init__(self, seconds: float):
        self._loop = asyncio.get_running_loop()
        self.at = self._loop.time() + seconds

    def left_s(self) -> float:
        return max(0.0, self.at - self._loop.time())

    @property
    def expired(self) -> bool:
        return self.left_s() <= 0.0


def client_timeout(total_s: float | None, *, sock_read_s: float | None = None) -> aiohttp.ClientTimeout:
    connect = CONNECT_TIMEOUT_S_DEFAULT if total_s is None else min(CONNECT_TIMEOUT_S_DEFAULT, total_s)
    return aiohttp.ClientTimeout(total=total_s, connect=connect, sock_read=sock_read_s)


def new_session(ssl_context: ssl.SSLContext | None = None) -> aiohttp.ClientSession:
    """A session without a session-wide timeout: every request states its own."""
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), connector=tls.connector(ssl_context))


def auth_headers(token: str | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    h = {"Authorization": f"Bearer {token}"} if token else {}
    if extra:
        h.update(extra)
    return h


# For the library's users; the CLI says it in its own words (ops/admin/options.py explain_tls_refusal)
TLS_DISCONNECT_HINT = (" (a server that requires client certificates closes the connection this way: give the client "
                       "an ssl_context with a certificate its CA signed, wire.tls.client_context(TlsFiles(cert, key, "
                       "ca)))")


def _tls_hint(url: str, e: BaseException) -> str:
    """What a bare disconnect on https most often means. A server whose tls has client_auth closes the connection
    of a caller without a client certificate and sends no alert that would say why (wire/tls.py,
    client_certificate_required, which the CLI runs to say it for sure)."""
    if not url.startswith("https://") or isinstance(e, aiohttp.ClientSSLError) or not isinstance(
            e, (aiohttp.ServerDisconnectedError, ConnectionResetError, aiohttp.ClientOSError)):
        return ""   # a certificate that did not verify says so itself
    return TLS_DISCONNECT_HINT


async def request_once(session: aiohttp.ClientSession, method: str, url: str, *, token: str | None,
                       json: Any = None, data: bytes | None = None, params: Mapping[str, Any] | None = None,
                       headers: Mapping[str, str] | None = None, timeout_s: float = REQUEST_TIMEOUT_S_DEFAULT,
                       ok: Iterable[int] = (200, 201), raw_answer: str | None = None) -> Answer:
    """One request, bounded by ``timeout_s``. Returns the answer when its status is in ``ok``; raises the API error
    (``StatorError`` subclass) for any other status and ``Unavailable`` when there is no answer. ``data``: a body of
    bytes (its Content-Type in ``headers``) instead of ``json``. ``raw_answer``: a content type whose successful
    answers are returned with their bytes as ``Answer.body`` (a binary batch); every other answer is JSON."""
    q = {k: str(v) for k, v in (params or {}).items() if v is not None}
    try:
        async with session.request(method, url, json=json, data=data, params=q, headers=auth_headers(token, headers),
                                   timeout=client_timeout(timeout_s)) as resp:
            raw = await resp.read()
            status, resp_headers, content_type = resp.status, resp.headers, resp.content_type
    except TRANSPORT_ERRORS as e:
        raise Unavailable(f"{method} {url}: {type(e).__name__}: {e}{_tls_hint(url, e)}", url=url, cause=e) from e
    if raw_answer is not None and content_type == raw_answer and status in tuple(ok):
        return Answer(status, raw, resp_headers, url)
    body: Any = None
    is_json = True
    if raw:
        try:
            body = jsonlib.loads(raw)
        except (ValueError, UnicodeDecodeError):
            body, is_json = raw[:ERROR_TEXT_CHARS_MAX].decode("utf-8", "replace"), False
    if status not in tuple(ok):
        err = StatorError.from_response(status, body, url=url)
        err.headers = resp_headers
        raise err
    if not is_json:
        raise StatorError(status, "INTERNAL", f"{method} {url}: answer is not JSON: {body[:100]!r}", url=url)
    return Answer(status, body, resp_headers, url)


class MetaCaller:
    """Calls the meta service through any of its nodes.

    It keeps talking to the node that answered last; on no answer or a retriable 5xx (``NO_LEADER``,
    ``VERSION_NOT_REACHED``, ...) it moves to the next node, backs off, and tries again, within ``attempts_max`` and
    ``deadline_s``. Other errors (400, 401, 404, 409, ...) are raised at once: trying again would not change them.
    """

    def __init__(self, urls: Sequence[str], token: str | None, *, session: aiohttp.ClientSession | None = None,
                 timeout_s: float = REQUEST_TIMEOUT_S_DEFAULT, attempts_max: int = META_ATTEMPTS_MAX_DEFAULT,
                 deadline_s: float = META_DEADLINE_S_DEFAULT, backoff: Backoff | None = None,
                 ssl_context: ssl.SSLContext | None = None):
        urls = [u.rstrip("/") for u in ([urls] if isinstance(urls, str) else urls)]
        if not urls:
            raise ValueError("at least one meta URL is needed")
        assert attempts_max >= 1 and timeout_s > 0 and deadline_s > 0
        self.urls = urls
        self.token = token
        self.timeout_s = timeout_s
        self.attempts_max = attempts_max
        self.deadline_s = deadline_s
        self.backoff = backoff or Backoff()
        self._index = 0
        self._session = session
        self._owns_session = session is None
        self._ssl_context = ssl_context   # for the session this caller makes (https:// endpoints; wire/tls.py)
        self._closed = False
        self.max_version_seen = 0  # newest X-Meta-Version (or written version) of any answer, error or not

    def note_version(self, version: int | None) -> None:
        """Remember ``version`` if it is the newest metadata version seen. Versions only grow (DESIGN.md invariant 3),
        so a read asking for at least this one never shows state older than something this caller already saw."""
        if isinstance(version, int) and not isinstance(version, bool) and version > self.max_version_seen:
            self.max_version_seen = version

    @property
    def url(self) -> str:
        """The node this caller is talking to now."""
        return self.urls[self._index]

    def fail_over(self, from_url: str) -> None:
        """Move to the next node, unless a concurrent call already moved away from ``from_url``."""
        if self.urls[self._index] == from_url:
            self._index = (self._index + 1) % len(self.urls)

    def session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise Closed("this client is closed")
        if self._session is None:
            self._session = new_session(self._ssl_context)
        return self._session

    async def call(self, method: str, path: str, *, json: Any = None, params: Mapping[str, Any] | None = None,
                   headers: Mapping[str, str] | None = None, ok: Iterable[int] = (200, 201),
                   timeout_s: float | None = None, attempts_max: int | None = None,
                   deadline_s: float | None = None, final_codes: frozenset[str] = frozenset()) -> Answer:
        """``final_codes``: retriable codes the caller handles itself, raised at once (a long poll's "not yet")."""
        ok = tuple(ok)
        deadline = Deadline(self.deadline_s if deadline_s is None else deadline_s)
        attempts = self.attempts_max if attempts_max is None else attempts_max
        per_try_s = self.timeout_s if timeout_s is None else timeout_s
        last: StatorError | None = None
        for attempt in range(attempts):
            left = deadline.left_s()
            if left <= 0:
                break
            url = self.url
            try:
                answer = await request_once(self.session(), method, url + path, token=self.token, json=json,
                                            params=params, headers=headers, timeout_s=min(per_try_s, left), ok=ok)
            except StatorError as e:
                self.note_version(e.meta_version)  # a refusal states its node's version too
                if not e.retriable_on_meta or e.code in final_codes:
                    raise
                last = e
                self.fail_over(url)
            else:
                self.note_version(answer.meta_version)
                return answer
            if attempt + 1 < attempts:
                pause = self.backoff.delay_s(attempt)
                if pause >= deadline.left_s():
                    break
                await asyncio.sleep(pause)
        assert last is not None or deadline.expired
        raise last or Unavailable(f"{method} {path}: deadline passed before any attempt", url=self.url)

    async def close(self) -> None:
        self._closed = True
        if self._owns_session and self._session is not None:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> MetaCaller:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
