"""The OpenAPI 3.1 description of the meta API (served at /v1/openapi.json; schemathesis can fuzz it)."""

from __future__ import annotations

from typing import Any

_ERR = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_OBJ = {"type": "object"}


def _op(summary: str, *, body: dict | None = None, params: list[dict] | None = None, ok: str = "200",
        roles: str = "client") -> dict[str, Any]:
    op: dict[str, Any] = {"summary": f"{summary} (roles: {roles})", "parameters": params or [],
                          "responses": {ok: {"description": "ok", "content": {"application/json": {"schema": _OBJ}}},
                                        "400": _ERR, "401": _ERR, "403": _ERR, "404": _ERR, "409": _ERR,
                                        "413": _ERR, "503": _ERR}}
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op


def _q(name: str, type_: str = "integer", desc: str = "") -> dict:
    return {"name": name, "in": "query", "required": False, "schema": {"type": type_}, "description": desc}


def _p(name: str) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


_READ = [_q("min_version", desc="wait until this node applied V"), _q("wait", "number", "seconds to wait, default 5"),
         _q("consistency", "string", "'linearizable' reads through the leader's log")]
_WRITE = [_q("expected_version", desc="the topic's version; mismatch is 409 VERSION_MISMATCH"),
          {"name": "Idempotency-Key", "in": "header", "required": False, "schema": {"type": "string"}}]
_NAME = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,127}$"}

SPEC: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "Stator meta service", "version": "v1"},
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {"Error": {"type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "details": _OBJ}}}}},
    },
    "security": [{"bearer": []}],
    "paths": {
        "/v1/cluster": {"get": _op("Cluster status", params=_READ)},
        "/v1/brokers": {"get": _op("List brokers", params=_READ)},
        "/v1/brokers/{broker}": {"put": _op("Register a broker (new epoch)", roles="broker", params=[_p("broker")],
                                            body={"type": "object", "required": ["address"], "properties": {
                                                "address": {"type": "string"}, "zone": {"type": "string"}}})},
        "/v1/brokers/{broker}/heartbeat": {"post": _op(
            "Broker heartbeat", roles="broker", params=[_p("broker")],
            body={"type": "object", "required": ["epoch"], "properties": {
                "epoch": {"type": "integer"}, "queues": {"type": "object", "additionalProperties": {"type": "integer"}}}})},
        "/v1/brokers/{broker}/seal": {"post": _op(
            "Report a sealed segment's end", roles="broker", params=[_p("broker")],
            body={"type": "object", "required": ["epoch", "topic", "queue", "gen", "end_offset"], "properties": {
                "epoch": {"type": "integer"}, "topic": _NAME, "queue": {"type": "integer"},
                "gen": {"type": "integer"}, "end_offset": {"type": "integer"}}})},
        "/v1/brokers/{broker}/seals": {"post": _op(
            "Report many sealed segments' ends in one command", roles="broker", params=[_p("broker")],
            body={"type": "object", "required": ["epoch", "seals"], "properties": {
                "epoch": {"type": "integer"}, "seals": {"type": "array", "items": {
                    "type": "object", "required": ["topic", "queue", "gen", "end_offset"], "properties": {
                        "topic": _NAME, "queue": {"type": "integer"}, "gen": {"type": "integer"},
                        "end_offset": {"type": "integer"}, "physical_queue": {"type": "string"}}}}}})},
        "/v1/topics/{topic}/queues/{queue}/segments": {"get": _op(
            "Every segment of one logic queue, oldest first", params=[_p("topic"), _p("queue")] + _READ)},
        "/v1/topics": {
            "get": _op("List topics", params=_READ),
            "post": _op("Create a static topic", ok="201", roles="admin", params=_WRITE[:],
                        body={"type": "object", "required": ["topic", "queues"], "properties": {
                            "topic": _NAME, "queues": {"type": "integer", "minimum": 1},
                            "brokers": {"type": "array", "items": {"type": "string"}},
                            "slots": {"type": "integer", "default": 1024},
                            "order": {"enum": ["best_tried", "strict"]},
                            "config": {"type": "object", "additionalProperties": {"type": "string"}}}}),
        },
        "/v1/topics/{topic}": {
            "get": _op("Describe a topic", params=[_p("topic"), *_READ]),
            "patch": _op("Grow a topic", roles="admin", params=[_p("topic"), *_WRITE],
                         body={"type": "object", "required": ["queues"], "properties": {"queues": {"type": "integer"}}}),
            "delete": _op("Delete a topic", roles="admin", params=[_p("topic"), *_WRITE]),
        },
        "/v1/topics/{topic}/config": {"put": _op("Set config keys (null removes)", roles="admin",
                                                 params=[_p("topic"), *_WRITE],
                                                 body={"type": "object", "additionalProperties": {"type": ["string", "null"]}})},
        "/v1/topics/{topic}/remap": {"post": _op("Move queues to brokers (seal-then-switch)", roles="admin",
                                                 params=[_p("topic"), *_WRITE],
                                                 body={"type": "object", "required": ["brokers"], "properties": {
                                                     "brokers": {"type": "array", "items": {"type": "string"}},
                                                     "queues": {"type": "array", "items": {"type": "integer"}}}})},
        "/v1/routes/{topic}": {"get": _op("Route, long poll", params=[_p("topic"), _q("after"), _q("wait", "number")])},
        "/v1/watch": {"get": {"summary": "Server-sent events: one 'route' event per topic change, id = version",
                              "parameters": [_q("topics", "string"), _q("after")],
                              "responses": {"200": {"description": "event stream",
                                                    "content": {"text/event-stream": {"schema": {"type": "string"}}}}}}},
        "/v1/history": {"get": _op("Events in version order, every version once; 503 HISTORY_UNAVAILABLE names a range "
                                   "this node holds in neither its image nor its projection yet", params=[_q("after"), _q("limit"), _q("topic", "string"), *_READ])},
        "/v1/admin/image-digest": {"get": _op("SHA-256 of this node's image at its applied version", roles="admin",
                                              params=_READ)},
        "/v1/admin/image": {"get": _op("This node's whole image as canonical JSON (headers X-Image-Version, "
                                       "X-Image-Sha256): a backup's source", roles="admin", params=_READ)},
        "/v1/groups": {"get": _op("List consumer groups", params=_READ)},
        "/v1/groups/{group}": {"get": _op("A group's members, assignments, tokens, lease ends, committed offsets and "
                                          "lag (served by the leader)", params=[_p("group")])},
        "/v1/groups/{group}/heartbeat": {"post": _op(
            "Join or renew a member; answers its owned queues with tokens and lease ends", params=[_p("group")],
            body={"type": "object", "required": ["member", "topics", "mode"], "properties": {
                "member": _NAME, "topics": {"type": "array", "items": _NAME},
                "mode": {"type": "string", "enum": ["exclusive", "shared"]},
                "released": {"type": "array", "items": {"type": "object", "properties": {
                    "topic": _NAME, "queue": {"type": "integer"}, "token": {"type": "integer"}}}}}})},
        "/v1/groups/{group}/leave": {"post": _op("Leave: releases the member's locks at once",
                                                 params=[_p("group"), *_WRITE],
                                                 body={"type": "object", "required": ["member"],
                                                       "properties": {"member": _NAME}})},
        "/v1/groups/{group}/config": {"put": _op(
            "Set group settings (null removes a key)", roles="admin", params=[_p("group"), *_WRITE],
            body={"type": "object", "properties": {
                "lease_ms": {"type": ["integer", "null"]}, "heartbeat_interval_ms": {"type": ["integer", "null"]},
                "max_attempts": {"type": ["integer", "null"]}, "retry_topic": {"type": ["string", "null"]},
                "mode": {"type": ["string", "null"], "enum": ["exclusive", "shared", None]}}})},
        "/healthz": {"get": _op("Alive", roles="none")},
        "/readyz": {"get": _op("Has a leader and caught up; projection_position, projection_gap_versions and "
                               "projection_complete say whether this node holds the whole history", roles="none")},
        "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "text"}}}},
        "/v1/openapi.json": {"get": {"summary": "This document", "responses": {"200": {"description": "spec"}}}},
    },
}
