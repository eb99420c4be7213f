"""The OpenAPI 3.1 description of the broker's data API (served at /v1/openapi.json, as API.md asks of every process).

Request and answer schemas are generated from broker/api/models.py, the models the handlers check bodies with;
tests/test_pop.py checks that the spec names every route the broker serves, tests/test_openapi_live.py that live
answers match it."""

from __future__ import annotations

from typing import Any

from wire import batch
from wire.shapes import Error, SpecSchemas

from . import models as M

_INT = {"type": "integer"}
_STR = {"type": "string"}
_NUMBER = {"type": "integer", "minimum": 0, "maximum": 2**62}   # queue ids in paths (wire/params.py)
_SPEC_SCHEMAS = SpecSchemas()


def _runs_op() -> dict[str, Any]:
    """A follower's fetch: its answer is binary runs, not JSON."""
    op = _op("A follower's fetch of every queue it copies from this broker, each from the offset it holds durably "
             "(its acknowledgement); binary sections of runs (broker/replication/frames.py)",
             Error, roles="broker, as the follower it names", body=M.ReplicaFetch)
    op["responses"]["200"]["content"] = {"application/x-stator-runs": {"schema": {"type": "string",
                                                                                   "format": "binary"}}}
    return op


def _stream_op() -> dict[str, Any]:
    """A follower's stream: a WebSocket (broker/replication/source.py), not a JSON answer."""
    op = _op("A follower's stream of the open heads it copies from this broker: a WebSocket; the follower sends "
             "where each copy stands after each of its syncs, this broker sends sections of runs as it writes them; "
             "both binary (broker/replication/frames.py)", Error,
             roles="broker, as the follower it names", params=_q("follower", "epoch"))
    op["responses"] = {"101": {"description": "switching to the WebSocket protocol"}, **{
        k: v for k, v in op["responses"].items() if k != "200"}}
    return op


def _op(summary: str, answer: Any, *, body: Any = None, params: list[dict] | None = None,
        roles: str = "client, broker") -> dict[str, Any]:
    err = {"description": "error", "content": _SPEC_SCHEMAS.content(Error)}
    op: dict[str, Any] = {"summary": f"{summary} (roles: {roles})", "parameters": params or [],
                          "responses": {"200": {"description": "ok", "content": _SPEC_SCHEMAS.content(answer)},
                                        **{s: err for s in ("400", "401", "403", "404", "409", "413", "503")}}}
    if body is not None:
        op["requestBody"] = {"required": True, "content": _SPEC_SCHEMAS.content(body)}
    return op


_BATCH = {batch.CONTENT_TYPE: {"schema": {"type": "string", "contentMediaType": batch.CONTENT_TYPE,
                                          "description": f"a binary batch, version {batch.VERSION} "
                                                         "(docs/batch-format.md)"}}}


def _send() -> dict[str, Any]:
    """The send: a JSON body or a SEND batch (Content-Type), a JSON answer either way; another type is 415."""
    op = _op("Send to the queue's writable head: JSON, or a binary SEND batch (Content-Type: "
             f"{batch.CONTENT_TYPE})", M.Sent, params=_p("topic", "queue"), body=M.Send)
    op["requestBody"]["content"].update(_BATCH)
    op["responses"]["415"] = {"description": "a Content-Type other than application/json and the batch's",
                              "content": _SPEC_SCHEMAS.content(Error)}
    return op


def _pull() -> dict[str, Any]:
    """The pull: JSON, or with ``Accept`` naming the batch type a STORED batch and the other fields in X-Pull."""
    op = _op(f"Pull over the queue's whole history: JSON, or a binary STORED batch (Accept: {batch.CONTENT_TYPE}) "
             "with the answer's other fields in the X-Pull header", M.Pulled, params=_p("topic", "queue")
             + _q("offset", "max", "group", "token"))
    ok = op["responses"]["200"]
    ok["content"].update(_BATCH)
    ok["headers"] = {"X-Pull": {
        "description": f"on a {batch.CONTENT_TYPE} answer only: every field of the JSON answer but messages, as "
                       "compact JSON", "content": _SPEC_SCHEMAS.content(M.PullFields)}}
    return op


def _pop() -> dict[str, Any]:
    """The pop: JSON, or with ``Accept`` naming the batch type a POPPED batch."""
    op = _op(f"Pop: messages hidden for invisible_ms, each with a handle: JSON, or a binary POPPED batch (Accept: "
             f"{batch.CONTENT_TYPE})", M.Popped, params=_p("topic"), body=M.Pop)
    op["responses"]["200"]["content"].update(_BATCH)
    return op


def _q(*names: str) -> list[dict]:
    return [{"name": n, "in": "query", "required": False, "schema": _STR if n in ("group", "local", "after") else _INT}
            for n in names]


def _p(*names: str) -> list[dict]:
    return [{"name": n, "in": "path", "required": True, "schema": _NUMBER if n == "queue" else _STR} for n in names]


SPEC: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "Stator broker", "version": "v1"},
    "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
                   "schemas": _SPEC_SCHEMAS.schemas},
    "security": [{"bearer": []}],
    "paths": {
        "/v1/messages/{topic}/{queue}": {
            "post": _send(),
            "get": _pull(),
        },
        "/v1/offsets/{group}/{topic}/{queue}": {
            "put": _op("Commit a consumer offset", M.CommittedOffset, params=_p("group", "topic", "queue"),
                       body=M.Commit),
            "get": _op("A committed offset (-1: never), answered by the queue's head", M.CommittedOffset,
                       params=_p("group", "topic", "queue") + _q("local")),
        },
        "/v1/offsets/{group}/{topic}": {"get": _op("Committed offsets and queue ends", M.GroupOffsets,
                                                   params=_p("group", "topic"))},
        "/v1/offsets": {"get": _op("Groups with a commit stored here, and their topics", M.CommittedGroups,
                                   params=_q("group"))},
        "/v1/queues/{topic}": {"get": _op("Logic min and max of the queues headed here", M.QueueRanges,
                                          params=_p("topic") + _q("count"))},
        "/v1/rates/{topic}": {"get": _op("Messages stored and served per minute, the last hour", M.LastHour,
                                         params=_p("topic"))},
        "/v1/queues/{topic}/{queue}/offset": {"get": _op("First offset at or after a time", M.OffsetForTime,
                                                         params=_p("topic", "queue") + _q("ts"))},
        "/v1/physical/{pq}": {"get": _op("Records of a physical queue", M.PhysicalRead, roles="broker",
                                         params=_p("pq") + _q("offset", "max", "ts", "start"))},
        "/v1/replica": {"post": _runs_op()},
        "/v1/replica/stream": {"get": _stream_op()},
        "/v1/replica/offsets": {"put": _op("A queue's leader pushes committed offsets to one of its copies",
                                           M.ReplicaStored, roles="broker", body=M.ReplicaOffsets)},
        "/v1/replica/offsets/{topic}/{queue}": {"get": _op(
            "Every commit of a queue held here, a page in group order, and the segments whose commits this disk "
            "holds: what a head that came to lead the queue takes over", M.ReplicaOffsetTable, roles="broker",
            params=_p("topic", "queue") + _q("after"))},
        "/v1/replica/pop": {"put": _op("A queue's leader pushes its pop journal lines to one of its copies",
                                       M.ReplicaStored, roles="broker", body=M.ReplicaPop)},
        "/v1/replica/producers": {"post": _op(
            "A new head's holder asks for the producers' batches of the segments its head continues",
            M.ReplicaProducers, roles="broker", body=M.ReplicaProducersAsk)},
        "/v1/pop/{topic}": {"post": _pop()},
        "/v1/ack": {"post": _op("Ack handles (ok, or INVALID_HANDLE / HANDLE_EXPIRED per handle; 503 NOT_ENOUGH_REPLICAS, "
                                "nothing applied, when a queue is below its min_insync; 503 REPLICATION_UNCONFIRMED, "
                                "stored here but in doubt, when its copies did not confirm or its head moved away)",
                                M.Acked, body=M.Ack)},
        "/v1/invisible": {"post": _op("Change a delivery's invisible time: a new handle, the old one expires",
                                      M.NewHandle, body=M.ChangeInvisible)},
        "/v1/dlq/{group}": {"get": _op("The group's dead letters", M.DeadLetters, params=_p("group")
                                       + _q("offset", "max"))},
        "/v1/pop-stats/{group}": {"get": _op("Pop offset, in-flight, revive backlog per queue; DLQ size", M.PopStats,
                                             params=_p("group"))},
        "/v1/pop-handover/{group}/{topic}/{queue}": {"post": _op(
            "A new head takes over this broker's pop state of a queue", M.Handover,
            roles="broker, the queue's head in the log only",
            params=_p("group", "topic", "queue") + _q("route_version", "copy_of_gen"))},
        "/v1/pop-adopt/{group}/{topic}/{queue}": {"post": _op(
            "An old head hands over deliveries that came due", M.Adopted,
            roles="broker, an older head of the queue in the log only",
            params=_p("group", "topic", "queue"), body=M.Adopt)},
        "/v1/pop-takeover/{group}/{topic}/{queue}": {"post": _op(
            "An older holder of a group's pop state of a queue led here asks the head to take it over now",
            M.TakeoverQueued, roles="broker", params=_p("group", "topic", "queue"))},
        "/healthz": {"get": {"summary": "Alive", "security": [], "responses": {
            "200": {"description": "ok", "content": _SPEC_SCHEMAS.content(M.Health)}}}},
        "/readyz": {"get": {"summary": "Registered and not fenced", "security": [], "responses": {
            "200": {"description": "ready", "content": _SPEC_SCHEMAS.content(M.Ready)},
            "503": {"description": "not ready", "content": _SPEC_SCHEMAS.content(M.Ready)}}}},
        "/metrics": {"get": {"summary": "Prometheus text", "security": [],
                             "responses": {"200": {"description": "ok"}}}},
        "/v1/openapi.json": {"get": {"summary": "This document", "security": [],
                                     "responses": {"200": {"description": "spec"}}}},
    },
}
