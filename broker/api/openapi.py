"""The OpenAPI 3.1 description of the broker's data API (served at /v1/openapi.json, as API.md asks of every process).
tests/test_pop.py checks that it names every route the broker serves."""

from __future__ import annotations

from typing import Any

_ERR = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_OBJ = {"type": "object"}
_INT = {"type": "integer"}
_STR = {"type": "string"}
_NUMBER = {"type": "integer", "minimum": 0, "maximum": 2**62}   # offsets, tokens, queue ids (client/wire/params.py)
_MESSAGE = {"type": "object", "properties": {"body": _STR, "body_b64": _STR, "key": _STR,
                                             "props": {"type": "object", "additionalProperties": _STR}},
            "oneOf": [{"required": ["body"]}, {"required": ["body_b64"]}]}   # exactly one of them (broker/codec.py)


def _op(summary: str, *, body: dict | None = None, params: list[dict] | None = None,
        roles: str = "client, broker") -> dict[str, Any]:
    op: dict[str, Any] = {"summary": f"{summary} (roles: {roles})", "parameters": params or [],
                          "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": _OBJ}}},
                                        **{s: _ERR for s in ("400", "401", "403", "404", "409", "413", "503")}}}
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op


def _q(*names: str) -> list[dict]:
    return [{"name": n, "in": "query", "required": False, "schema": _STR if n in ("group", "local") else _INT}
            for n in names]


def _p(*names: str) -> list[dict]:
    return [{"name": n, "in": "path", "required": True, "schema": _NUMBER if n == "queue" else _STR} for n in names]


def _body(required: list[str], **props: dict) -> dict:
    return {"type": "object", "required": required, "properties": props}


SPEC: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "Stator broker", "version": "v1"},
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {"Error": _body(["error"], error=_body(["code", "message"], code=_STR, message=_STR,
                                                           details=_OBJ))},
    },
    "security": [{"bearer": []}],
    "paths": {
        "/v1/messages/{topic}/{queue}": {
            "post": _op("Send to the queue's writable head", params=_p("topic", "queue"),
                        body=_body(["messages"], messages={"type": "array", "minItems": 1, "maxItems": 10_000,
                                                           "items": _MESSAGE})),
            "get": _op("Pull over the queue's whole history", params=_p("topic", "queue")
                       + _q("offset", "max", "group", "token")),
        },
        "/v1/offsets/{group}/{topic}/{queue}": {
            "put": _op("Commit a consumer offset", params=_p("group", "topic", "queue"),
                       body=_body(["offset"], offset={**_NUMBER, "minimum": -1}, token=_NUMBER)),
            "get": _op("A committed offset (-1: never)", params=_p("group", "topic", "queue") + _q("local")),
        },
        "/v1/offsets/{group}/{topic}": {"get": _op("Committed offsets and queue ends", params=_p("group", "topic"))},
        "/v1/queues/{topic}": {"get": _op("Logic min and max of the queues headed here", params=_p("topic"))},
        "/v1/queues/{topic}/{queue}/offset": {"get": _op("First offset at or after a time",
                                                         params=_p("topic", "queue") + _q("ts"))},
        "/v1/physical/{pq}": {"get": _op("Records of a physical queue", roles="broker", params=_p("pq")
                                         + _q("offset", "max", "ts"))},
        "/v1/pop/{topic}": {"post": _op(
            "Pop: messages hidden for invisible_ms, each with a handle", params=_p("topic"),
            body=_body(["group"], group=_STR, max={"type": "integer", "minimum": 1, "maximum": 1000, "default": 32},
                       invisible_ms={"type": "integer", "minimum": 1000, "maximum": 43_200_000, "default": 60_000},
                       queue=_INT, order={"type": "boolean", "default": False},
                       wait_ms={"type": "integer", "minimum": 0, "maximum": 30_000, "default": 0}))},
        "/v1/ack": {"post": _op("Ack handles (ok, or INVALID_HANDLE / HANDLE_EXPIRED per handle)",
                                body=_body(["group", "handles"], group=_STR, handles={
                                    "type": "array", "minItems": 1, "maxItems": 1000, "items": _STR}))},
        "/v1/invisible": {"post": _op("Change a delivery's invisible time: a new handle, the old one expires",
                                      body=_body(["group", "handle", "invisible_ms"], group=_STR, handle=_STR,
                                                 invisible_ms={"type": "integer", "minimum": 1000,
                                                               "maximum": 43_200_000}))},
        "/v1/dlq/{group}": {"get": _op("The group's dead letters", params=_p("group") + _q("offset", "max"))},
        "/v1/pop-stats/{group}": {"get": _op("Pop offset, in-flight, revive backlog per queue; DLQ size",
                                             params=_p("group"))},
        "/v1/pop-handover/{group}/{topic}/{queue}": {"post": _op(
            "A new head takes over this broker's pop state of a queue", roles="broker",
            params=_p("group", "topic", "queue") + _q("route_version"))},
        "/v1/pop-adopt/{group}/{topic}/{queue}": {"post": _op(
            "An old head hands over deliveries that came due", roles="broker", params=_p("group", "topic", "queue"),
            body=_body(["deliveries"], deliveries={"type": "array", "items": {
                "type": "array", "items": _INT, "minItems": 2, "maxItems": 2}}))},
        "/healthz": {"get": {"summary": "Alive", "security": [], "responses": {"200": {"description": "ok"}}}},
        "/readyz": {"get": {"summary": "Registered and not fenced", "security": [],
                            "responses": {"200": {"description": "ready"}, "503": _ERR}}},
        "/metrics": {"get": {"summary": "Prometheus text", "security": [],
                             "responses": {"200": {"description": "ok"}}}},
        "/v1/openapi.json": {"get": {"summary": "This document", "security": [],
                                     "responses": {"200": {"description": "spec"}}}},
    },
}
