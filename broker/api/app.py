"""The broker's aiohttp application: data API handlers, auth, errors, X-Route-Version on every answer."""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Mapping

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from wire import batch, json_body
from wire.errors import invalid, rejection
from wire.shapes import validate
from runtime.credentials import caller_broker
from runtime.server import error_middleware, public, require_declared_roles, requires
from wire.params import PULL_MESSAGES_MAX, int_in, optional_int

from ..config import BrokerConfig
from ..codec import TAG_RECORDS, binary_runs, dumps_with_raw, popped_batch
from ..node import BrokerNode
from ..pop import params as pop_params
from ..producers import PRODUCER_ID_MAX, SEQ_MAX
from ..replication import frames
from ..replication import offsets as offset_copies
from ..replication.source import STREAM_HEARTBEAT_S
from ..storage.limits import RECORD_BYTES_MAX
from ..writes import MESSAGES_PER_SEND_MAX
from . import models
from .send_body import read_send

NODE = web.AppKey("node", BrokerNode)
REQUEST_BODY_BYTES_MAX = 32 * 1024 * 1024
NAME_CHARS_MAX = 255


def _respond(data, status: int = 200) -> web.Response:
    return web.Response(body=dumps_with_raw(data), status=status, content_type="application/json")


def _name(raw: str, what: str) -> str:
    if not raw or len(raw) > NAME_CHARS_MAX or not json_body.is_scalar_text(raw):
        raise invalid(f"{what} must be 1-{NAME_CHARS_MAX} characters of valid Unicode", field=what)
    return raw


async def _json(request: web.Request, model) -> dict:
    """The request's JSON object, checked against ``model`` (broker/api/models.py, the spec's source)."""
    return validate(model, json_body.parse_object(await request.read()))


def _tokens(app: web.Application) -> dict[str, str | None]:
    cfg = app[NODE].config
    return {"admin": cfg.admin_token, "client": cfg.client_token}


def _broker_tokens(app: web.Application) -> Mapping[str, str]:
    return app[NODE].config.broker_tokens


def _observe(request: web.Request, status: int, seconds: float) -> None:
    request.app[NODE].metrics.requests(str(status)).inc()


def _refused(request: web.Request, code: str) -> None:
    request.app[NODE].metrics.refusals.labels(code).inc()


middleware = error_middleware(_tokens, "broker", _observe, _refused, _broker_tokens)


async def _route_version(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["X-Route-Version"] = str(request.app[NODE].routes.version)


# Send bodies taken as JSON besides application/json: no type at all, and the types HTTP tools put on a body whose
# caller named none (aiohttp and others: application/octet-stream; curl -d: application/x-www-form-urlencoded). The
# API took every send body as JSON before the binary batch, so these keep working; any other type is refused (415).
_JSON_UNNAMED = frozenset({"", "application/json", "application/octet-stream", "application/x-www-form-urlencoded"})


def _media_type(raw: str | None) -> str:
    return "" if raw is None else raw.partition(";")[0].strip().lower()


def _wants_batch(accept: str | None) -> bool:
    """Whether ``Accept`` asks for the binary batch: it names the type with a q above 0, and names
    application/json with no higher q (wildcards are no preference: a caller naming the batch type wants it)."""
    if not accept or batch.CONTENT_TYPE not in accept.lower():
        return False
    q_of: dict[str, float] = {}
    for part in accept.lower().split(","):
        kind, _, params = part.partition(";")
        q = 1.0
        for p in params.split(";"):
            name, _, value = p.partition("=")
            if name.strip() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        q_of[kind.strip()] = max(q, q_of.get(kind.strip(), 0.0))
    q_batch = q_of.get(batch.CONTENT_TYPE, 0.0)
    return q_batch > 0 and q_batch >= q_of.get("application/json", 0.0)


@requires("client", "broker")
async def send(request: web.Request) -> web.Response:
    node = request.app[NODE]
    topic = _name(request.match_info["topic"], "topic")
    queue = int_in(request.match_info["queue"], "queue")
    kind = _media_type(request.headers.get("Content-Type"))
    if kind != batch.CONTENT_TYPE and kind not in _JSON_UNNAMED:
        raise rejection(415, "INVALID_ARGUMENT", f"a send body is application/json or {batch.CONTENT_TYPE}, not "
                        f"{kind!r}", field="Content-Type", content_type=kind,
                        supported=["application/json", batch.CONTENT_TYPE])
    raw = await request.read()
    raw_version = request.headers.get("X-Route-Version")
    sender_version = optional_int(raw_version, "X-Route-Version")
    producer = _producer(request)
    if kind == batch.CONTENT_TYPE:
        # The binary batch: its header, CRC and every record's lengths are checked before anything is appended;
        # the records are stored as they came, bodies never read.
        send = batch.check_send(raw, count_max=MESSAGES_PER_SEND_MAX, record_bytes_max=RECORD_BYTES_MAX)
        offsets = await node.writer.send_records(topic, queue, send, TAG_RECORDS, sender_version, producer=producer)
    else:
        # The hot path: the envelope is checked in send_body.py, each message by the codec as it encodes it (a model
        # check of 100 messages would cost a fifth of the encoding again); tests/test_openapi_live.py holds the two
        # together.
        messages, plain = read_send(raw)
        offsets = await node.writer.send(topic, queue, messages, sender_version, plain, producer)
    # The answer of every send, written directly: a hundred offsets through dumps_with_raw was a tenth of a send,
    # and one bytes format of them all half of joining their strings (7 against 14 us for 100).
    return web.Response(body=b'{"queue":%d,"offsets":[' % queue + _offsets_format(len(offsets)) % tuple(offsets)
                        + b"]}", content_type="application/json")


def _producer(request: web.Request) -> tuple[int, int] | None:
    """(id, batch number) of an idempotent producer's send (broker/producers.py), both headers or neither."""
    pid, seq = request.headers.get("X-Producer-Id"), request.headers.get("X-Producer-Seq")
    if pid is None and seq is None:
        return None
    if pid is None or seq is None:
        raise invalid("X-Producer-Id and X-Producer-Seq go together", field="X-Producer-Seq")
    return (int_in(pid, "X-Producer-Id", 0, 0, PRODUCER_ID_MAX), int_in(seq, "X-Producer-Seq", 0, 0, SEQ_MAX))


@functools.lru_cache(maxsize=64)
def _offsets_format(count: int) -> bytes:
    """``%d,%d,...`` for ``count`` offsets; a send's count repeats (a producer's batch size)."""
    return b",".join([b"%d"] * count)


def _token(raw: object) -> int | None:
    """A lock token (query string or JSON); None when absent."""
    return optional_int(raw, "token")


@requires("client", "broker")
async def pull(request: web.Request) -> web.Response:
    node = request.app[NODE]
    q = request.query
    topic = _name(request.match_info["topic"], "topic")
    queue = int_in(request.match_info["queue"], "queue")
    offset = int_in(q.get("offset"), "offset", 0)
    max_n = int_in(q.get("max"), "max", 32, 1, PULL_MESSAGES_MAX)
    token = _token(q.get("token"))
    group = _name(q["group"], "group") if "group" in q else None
    held_by = await node.gate.pull(group, topic, queue, token)
    answer = await node.reader.pull(topic, queue, offset, max_n, held_by)
    if not _wants_batch(request.headers.get("Accept")):
        return _respond(answer)
    # The binary answer: the runs read as a STORED batch, a binary send's records as they lie on disk and a JSON
    # send's converted; every other field of the JSON answer in one header.
    runs = answer.pop("messages")
    body = batch.encode_stored(binary_runs(runs))   # no runs: the empty STORED batch
    return web.Response(body=body, headers={"Content-Type": batch.CONTENT_TYPE,
                                            "X-Pull": json.dumps(answer, separators=(",", ":"))})


@requires("client", "broker")
async def commit_offset(request: web.Request) -> web.Response:
    node = request.app[NODE]
    body = await _json(request, models.Commit)
    offset = int_in(body.get("offset"), "offset", None, -1)
    token = _token(body.get("token"))
    group = _name(request.match_info["group"], "group")
    topic = _name(request.match_info["topic"], "topic")
    queue = int_in(request.match_info["queue"], "queue")
    await node.gate.commit(group, topic, queue, token)
    return _respond({"offset": await node.writer.commit_offset(group, topic, queue, offset)})


@requires("client", "broker")
async def group_offsets(request: web.Request) -> web.Response:
    """A group's committed offsets beside the queues' ends, for the queues whose head is here (meta's describe)."""
    node = request.app[NODE]
    group = _name(request.match_info["group"], "group")
    topic = _name(request.match_info["topic"], "topic")
    return _respond({"queues": await node.reader.group_offsets(group, topic)})


COMMITTED_GROUPS_LISTED_MAX = 10_000   # groups one listing answers; ``truncated`` says there are more


@requires("client", "broker")
async def committed_groups(request: web.Request) -> web.Response:
    """The groups with a commit or pop state stored here, each with its topics (``?group=`` for one): how meta finds
    the pull and pop groups, which consume through brokers and never tell meta. Every commit this broker holds
    counts, on a head or on an older segment, so a group whose queues all moved on since its last commit is still
    found."""
    node = request.app[NODE]
    only = _name(request.query["group"], "group") if "group" in request.query else None
    topics: dict[str, set[str]] = {}
    for group, topic, _queue in itertools.chain(node.offsets.snapshot(), list(node.pop.states)):
        if only is None or group == only:
            topics.setdefault(group, set()).add(topic)
    names = sorted(topics)
    return _respond({"groups": [{"group": g, "topics": sorted(topics[g])} for g in names[:COMMITTED_GROUPS_LISTED_MAX]],
                     "truncated": len(names) > COMMITTED_GROUPS_LISTED_MAX})


@requires("client", "broker")
async def read_offset(request: web.Request) -> web.Response:
    node = request.app[NODE]
    group = _name(request.match_info["group"], "group")
    topic = _name(request.match_info["topic"], "topic")
    queue = int_in(request.match_info["queue"], "queue")
    local = request.query.get("local") == "1"
    offset, gen = await node.reader.read_committed(group, topic, queue, local)
    if not local:
        return _respond({"offset": offset})
    # A broker asking for this one's own value also learns the gen it was committed on (the newest wins) and the
    # segments whose commits this disk holds (broker/offset_witness.py): only those this answer settles.
    return _respond({"offset": offset, "gen": gen, "holds": sorted(node.witness.held(topic, queue))})


@requires("client", "broker")
async def last_hour(request: web.Request) -> web.Response:
    """The topic's messages stored and served here per minute, the last hour (broker/rates.py)."""
    topic = _name(request.match_info["topic"], "topic")
    return _respond({"topic": topic, **request.app[NODE].metrics.last_hour.last_hour(topic)})


@requires("client", "broker")
async def queues(request: web.Request) -> web.Response:
    node = request.app[NODE]
    count = int_in(request.query.get("count"), "count", 0, 0, 1) == 1
    return _respond({"queues": await node.reader.queue_stats(_name(request.match_info["topic"], "topic"), count)})


@requires("broker")
async def physical(request: web.Request) -> web.Response:
    node = request.app[NODE]
    offset = int_in(request.query.get("offset"), "offset", 0)
    max_n = int_in(request.query.get("max"), "max", 32, 0, PULL_MESSAGES_MAX)
    return _respond(await node.reader.physical_read(request.match_info["pq"], offset, max_n,
                                                    optional_int(request.query.get("ts"), "ts"),
                                                    optional_int(request.query.get("start"), "start")))


def _as_follower(request: web.Request, follower: str) -> str:
    """The follower a fetch or stream names: a broker caller may name only itself (an admin any)."""
    caller = caller_broker(request)
    if caller is not None and caller != follower:
        raise rejection(403, "PERMISSION_DENIED", f"broker {caller!r} may not fetch as {follower!r}", caller=caller)
    return follower


@requires("broker")
async def replica_fetch(request: web.Request) -> web.Response:
    """A follower's fetch of every queue it copies from this broker (broker/replication): ``{"follower",
    "queues": [{"pq", "offset"}]}`` (``offset``: what the follower holds durably of ``pq``) answers binary sections
    (replication/frames.py) of the queues with records past their offset."""
    node = request.app[NODE]
    body = await _json(request, models.ReplicaFetch)
    follower = _as_follower(request, body["follower"])
    sections = await node.replica_source.fetch(follower, body["epoch"],
                                               [(q["pq"], q["offset"]) for q in body["queues"]])
    return web.Response(body=frames.encode(sections), headers={"Content-Type": frames.CONTENT_TYPE})


@requires("broker")
async def replica_offsets(request: web.Request) -> web.Response:
    """A queue's leader pushes committed offsets to this copy (broker/replication/offsets.py): answered once they
    are durable here; 409 NOT_LEADER when this broker knows a newer head of the queue."""
    node = request.app[NODE]
    topic, queue, leader_gen, values = offset_copies.decode(await _json(request, models.ReplicaOffsets))
    await node.writer.offset_copies.receive(topic, queue, leader_gen, values)
    return _respond({"stored": len(values)})


@requires("broker")
async def replica_offset_table(request: web.Request) -> web.Response:
    """Every commit of a queue this broker holds, a page in group order (``after``: the last group of the page
    before), and the segments whose commits its disk holds (broker/offset_witness.py): what a head that came to lead
    the queue takes over (broker/replication/offsets.py)."""
    node = request.app[NODE]
    topic = _name(request.match_info["topic"], "topic")
    queue = int_in(request.match_info["queue"], "queue")
    after = _name(request.query["after"], "after") if "after" in request.query else None
    values = sorted((k, v) for k, v in node.offsets.queue_values(topic, queue) if after is None or k[0] > after)
    page = values[:offset_copies.TABLE_PAGE_MAX]
    return _respond({"commits": [{"group": g, "offset": v.offset, "gen": v.gen, "seq": v.seq} for (g, _, _), v in page],
                     "next": page[-1][0][0] if len(values) > len(page) else None,
                     "holds": sorted(node.witness.held(topic, queue))})


@requires("broker")
async def replica_producers(request: web.Request) -> web.Response:
    """A new head's holder asks for the producers' batches of the segments its head continues
    (broker/replication/producer_handover.py): answered for the queues whose previous segment this broker holds."""
    node = request.app[NODE]
    body = await _json(request, models.ReplicaProducersAsk)
    return _respond(await node.writer.producer_handover.answer(body["queues"], body["route_version"]))


@requires("broker")
async def replica_pop(request: web.Request) -> web.Response:
    """A queue's leader pushes its pop journal lines to this copy (broker/replication/pop_copies.py): answered once
    they are durable here; 409 NOT_LEADER when this broker knows a newer head of the queue."""
    node = request.app[NODE]
    body = await _json(request, models.ReplicaPop)
    await node.pop.receive_copy(body["topic"], body["queue"], body["leader_gen"], body["reset"], body["lines"])
    return _respond({"stored": len(body["lines"])})


@requires("broker")
async def replica_stream(request: web.Request) -> web.StreamResponse:
    """A follower's stream of every open head it copies from this broker (broker/replication/source.py): a
    WebSocket; ``?follower=`` names it. It sends where each copy stands (replication/frames.py encode_positions);
    this broker sends binary sections of runs (frames.py encode). Both binary."""
    node = request.app[NODE]
    follower = _as_follower(request, _name(request.query.get("follower", ""), "follower"))
    epoch = int_in(request.query.get("epoch"), "epoch", None, 0)
    ws = web.WebSocketResponse(heartbeat=STREAM_HEARTBEAT_S, max_msg_size=frames.POSITIONS_BYTES_MAX)
    if not ws.can_prepare(request).ok:
        raise invalid("a replica stream is a WebSocket: send the Upgrade headers")
    await ws.prepare(request)
    await node.replica_source.serve_stream(ws, follower, epoch)
    return ws


@requires("client", "broker")
async def offset_for_time(request: web.Request) -> web.Response:
    node = request.app[NODE]
    topic = _name(request.match_info["topic"], "topic")
    queue = int_in(request.match_info["queue"], "queue")
    ts = int_in(request.query.get("ts"), "ts")
    return _respond({"queue": queue, "offset": await node.reader.offset_for_time(topic, queue, ts)})


# -- pop (broker/pop/) ---------------------------------------------------------------------------------------------

@requires("client", "broker")
async def pop(request: web.Request) -> web.Response:
    node = request.app[NODE]
    topic = _name(request.match_info["topic"], "topic")
    p = pop_params.pop_request(await _json(request, models.Pop))
    messages = await node.pop.pop(topic, p.group, p.max, p.invisible_ms, p.queue, p.order, p.wait_ms)
    if _wants_batch(request.headers.get("Accept")):
        return web.Response(body=popped_batch(messages), headers={"Content-Type": batch.CONTENT_TYPE})
    return _respond({"messages": messages})


@requires("client", "broker")
async def ack(request: web.Request) -> web.Response:
    group, handles = pop_params.ack_request(await _json(request, models.Ack))
    return _respond({"results": await request.app[NODE].pop.ack(group, handles)})


@requires("client", "broker")
async def change_invisible(request: web.Request) -> web.Response:
    group, handle, invisible_ms = pop_params.invisible_request(await _json(request, models.ChangeInvisible))
    return _respond({"handle": await request.app[NODE].pop.change_invisible(group, handle, invisible_ms)})


@requires("client", "broker")
async def dead_letters(request: web.Request) -> web.Response:
    group = _name(request.match_info["group"], "group")
    offset, max_n = pop_params.dlq_query(request.query)
    return _respond(await request.app[NODE].pop.dlq.read(group, offset, max_n))


@requires("client", "broker")
async def pop_stats(request: web.Request) -> web.Response:
    """Per queue of the group with pop state here: pop offset, in-flight, invisible, revive backlog; DLQ size."""
    node = request.app[NODE]
    group = _name(request.match_info["group"], "group")
    return _respond({"group": group, "broker": node.config.broker, "queues": node.pop.stats(group),
                     "dlq_messages": node.pop.dlq.sizes.get(group, 0)})


@requires("broker")
async def pop_handover(request: web.Request) -> web.Response:
    """Another broker took the queue's head: freeze this broker's pop state of it and say where it stood."""
    node = request.app[NODE]
    key = (_name(request.match_info["group"], "group"), _name(request.match_info["topic"], "topic"),
           int_in(request.match_info["queue"], "queue"))
    version = int_in(request.query.get("route_version"), "route_version", 0)
    copy_of_gen = optional_int(request.query.get("copy_of_gen"), "copy_of_gen")
    above_gen = optional_int(request.query.get("above_gen"), "above_gen")
    return _respond(await node.pop.freeze(key, version, caller_broker(request), copy_of_gen, above_gen))


@requires("broker")
async def pop_adopt(request: web.Request) -> web.Response:
    """An older head hands over deliveries of its frozen pop state that came due: deliver them again from here."""
    node = request.app[NODE]
    key = (_name(request.match_info["group"], "group"), _name(request.match_info["topic"], "topic"),
           int_in(request.match_info["queue"], "queue"))
    deliveries = pop_params.adopt_request(await _json(request, models.Adopt))
    return _respond({"adopted": await node.pop.adopt(key, deliveries, caller_broker(request))})


@requires("broker")
async def pop_takeover(request: web.Request) -> web.Response:
    """An older holder of a group's pop state of a queue led here says so: take it over now (PopService.take_over_soon)."""
    node = request.app[NODE]
    key = (_name(request.match_info["group"], "group"), _name(request.match_info["topic"], "topic"),
           int_in(request.match_info["queue"], "queue"))
    node.pop.take_over_soon(key)
    return _respond({"queued": True})


@public
async def healthz(request: web.Request) -> web.Response:
    return _respond({"status": "ok", "broker": request.app[NODE].config.broker})


@public
async def readyz(request: web.Request) -> web.Response:
    node = request.app[NODE]
    ok = node.session.writable(node.routes.version)
    return _respond({"ready": ok, "state": node.session.state, "epoch": node.session.epoch,
                     "route_version": node.routes.version}, 200 if ok else 503)


@public
async def openapi(request: web.Request) -> web.Response:
    # Imported at the first request: building the document's schemas costs CPU every broker start paid at import
    from .openapi import SPEC
    return _respond(SPEC)


@public
async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(request.app[NODE].registry),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})


def make_app(config: BrokerConfig, driven: bool = False) -> web.Application:
    """The broker's HTTP API around its node; ``driven``: BrokerNode's mode without threads (the simulator's)."""
    app = web.Application(middlewares=[middleware], client_max_size=REQUEST_BODY_BYTES_MAX)
    node = BrokerNode(config, driven=driven)
    app[NODE] = node

    async def node_ctx(app):
        await node.start()
        yield
        await node.stop()

    app.cleanup_ctx.append(node_ctx)

    async def close_streams(app):   # before the server's shutdown waits on them
        await node.replica_source.close_streams()

    app.on_shutdown.append(close_streams)
    app.on_response_prepare.append(_route_version)
    r = app.router
    r.add_post("/v1/messages/{topic}/{queue}", send)
    r.add_get("/v1/messages/{topic}/{queue}", pull)
    r.add_put("/v1/offsets/{group}/{topic}/{queue}", commit_offset)
    r.add_get("/v1/offsets/{group}/{topic}/{queue}", read_offset)
    r.add_get("/v1/offsets/{group}/{topic}", group_offsets)
    r.add_get("/v1/offsets", committed_groups)
    r.add_get("/v1/queues/{topic}", queues)
    r.add_get("/v1/queues/{topic}/{queue}/offset", offset_for_time)
    r.add_get("/v1/rates/{topic}", last_hour)
    r.add_get("/v1/physical/{pq}", physical)
    r.add_post("/v1/replica", replica_fetch)
    r.add_get("/v1/replica/stream", replica_stream)
    r.add_put("/v1/replica/offsets", replica_offsets)
    r.add_get("/v1/replica/offsets/{topic}/{queue}", replica_offset_table)
    r.add_put("/v1/replica/pop", replica_pop)
    r.add_post("/v1/replica/producers", replica_producers)
    r.add_post("/v1/pop/{topic}", pop)
    r.add_post("/v1/ack", ack)
    r.add_post("/v1/invisible", change_invisible)
    r.add_get("/v1/dlq/{group}", dead_letters)
    r.add_get("/v1/pop-stats/{group}", pop_stats)
    r.add_post("/v1/pop-handover/{group}/{topic}/{queue}", pop_handover)
    r.add_post("/v1/pop-adopt/{group}/{topic}/{queue}", pop_adopt)
    r.add_post("/v1/pop-takeover/{group}/{topic}/{queue}", pop_takeover)
    r.add_get("/healthz", healthz)
    r.add_get("/readyz", readyz)
    r.add_get("/metrics", metrics)
    r.add_get("/v1/openapi.json", openapi)
    require_declared_roles(app, "broker")
    return app
