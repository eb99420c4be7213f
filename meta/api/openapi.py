"""The OpenAPI 3.1 description of the meta API (served at /v1/openapi.json; schemathesis fuzzes it).

Request and response schemas are generated from meta/api/models.py, the shapes the handlers validate bodies with,
so the spec cannot drift from the checks; tests/test_openapi_live.py validates live answers against it.
"""

from __future__ import annotations

from typing import Any

from wire.shapes import Error, SpecSchemas

from . import models

_SPEC_SCHEMAS = SpecSchemas()


# A broker's own token proves its id: it may act for the broker in the path only (the admin token for any).
_THIS_BROKER = "broker, the one in the path only"


def _op(summary: str, *, body: Any = None, params: list[dict] | None = None, ok: str = "200",
        roles: str = "client", answer: Any = models.WriteResult) -> dict[str, Any]:
    err = {"description": "error", "content": _SPEC_SCHEMAS.content(Error)}
    op: dict[str, Any] = {"summary": f"{summary} (roles: {roles})", "parameters": params or [],
                          "responses": {ok: {"description": "ok", "content": _SPEC_SCHEMAS.content(answer)},
                                        "400": err, "401": err, "403": err, "404": err, "409": err,
                                        "413": err, "503": err}}
    if body is not None:
        op["requestBody"] = {"required": True, "content": _SPEC_SCHEMAS.content(body)}
    return op


def _q(name: str, type_: str = "integer", desc: str = "") -> dict:
    return {"name": name, "in": "query", "required": False, "schema": {"type": type_}, "description": desc}


def _p(name: str) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


_READ = [_q("min_version", desc="wait until this node applied V"), _q("wait", "number", "seconds to wait, default 5"),
         _q("consistency", "string", "'linearizable' reads through the leader's log")]
_WRITE = [_q("expected_version", desc="the topic's version; mismatch is 409 VERSION_MISMATCH"),
          {"name": "Idempotency-Key", "in": "header", "required": False, "schema": {"type": "string"}}]

M = models
SPEC: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "Stator meta service", "version": "v1"},
    "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}, "schemas": _SPEC_SCHEMAS.schemas},
    "security": [{"bearer": []}],
    "paths": {
        "/v1/cluster": {"get": _op("Cluster status", params=_READ, answer=M.Cluster)},
        "/v1/cluster/members": {
            "get": _op("The meta cluster's members, as the log records them", params=_READ,
                       answer=M.ClusterMembers),
            "post": _op("Add a meta node as a learner (one membership change at a time)", roles="admin",
                        body=M.AddMember, ok="201", answer=M.ClusterMembers)},
        "/v1/cluster/members/{node}/promote": {"post": _op("Promote a learner that caught up to a voter",
                                                           roles="admin", params=[_p("node")],
                                                           answer=M.ClusterMembers)},
        "/v1/cluster/members/{node}": {"delete": _op("Remove a meta node from the members", roles="admin",
                                                     params=[_p("node")], answer=M.ClusterMembers)},
        "/v1/brokers": {"get": _op("List brokers", params=[
            _q("include", "string", "heads: also how many logic queues each holds the head of (one pass over every "
               "queue)"), *_READ], answer=M.Brokers)},
        "/v1/brokers/{broker}": {"put": _op("Register a broker (new epoch), with the id of its data directory: "
                                            "the one it had, it kept its copies; another, it lost them",
                                            roles=_THIS_BROKER, params=[_p("broker")],
                                            body=M.RegisterBroker),
                                 "get": _op("Describe a broker: its heads, the heads it holds a copy of (what a drain "
                                            "still moves), its older segments' copies", params=[_p("broker"), *_READ],
                                            answer=M.BrokerDetail)},
        "/v1/brokers/{broker}/copies-held": {"post": _op(
            "The broker holds whole copies of sealed segments a drain placed on it: it joins their in-sync sets, and "
            "a draining broker's copy is no longer named", roles=_THIS_BROKER, params=[_p("broker")],
            body=M.CopiesHeld)},
        "/v1/brokers/{broker}/drain": {"post": _op(
            "Start (draining true) or stop a drain: the heads the broker holds a copy of move, a step at a time, to new "
            "gens copied elsewhere (to: those brokers first)", roles="admin", params=[_p("broker")],
            body=M.DrainBroker)},
        "/v1/brokers/{broker}/heartbeat": {"post": _op("Broker heartbeat", roles=_THIS_BROKER, params=[_p("broker")],
                                                       body=M.BrokerHeartbeat, answer=M.BrokerHeartbeatAnswer)},
        "/v1/brokers/{broker}/seal": {"post": _op("Report a sealed segment's end", roles=_THIS_BROKER,
                                                  params=[_p("broker")], body=M.Seal)},
        "/v1/brokers/{broker}/seals": {"post": _op("Report many sealed segments' ends in one command",
                                                   roles=_THIS_BROKER,
                                                   params=[_p("broker")], body=M.Seals, answer=M.SealResults)},
        "/v1/brokers/{broker}/in-sync": {"post": _op("A head's leader changes who is in sync (fenced by the gen it "
                                                     "leads)", roles=_THIS_BROKER, params=[_p("broker")],
                                                     body=M.AlterInSync, answer=M.InSyncResults)},
        "/v1/brokers/{broker}/peer-down": {"post": _op(
            "A broker could not reach a peer: the leader probes the peer's address and fences it when nothing listens "
            "there (its process is gone), before its session runs out", roles=_THIS_BROKER, params=[_p("broker")],
            body=M.PeerDown, answer=M.PeerDownAnswer)},
        "/v1/brokers/{broker}/copies": {"get": _op(
            "Every sealed segment the broker holds a copy of, a page at a time (after=TOPIC:QUEUE:GEN): what a broker "
            "back on a new disk catches up", roles=_THIS_BROKER,
            params=[_p("broker"), _q("after", "string"), _q("limit"), *_READ], answer=M.SealedCopies)},
        "/v1/topics/{topic}/queues/{queue}/segments": {"get": _op(
            "Every segment of one logic queue, oldest first", params=[_p("topic"), _p("queue")] + _READ,
            answer=M.QueueSegments)},
        "/v1/topics": {
            "get": _op("List topics", params=_READ, answer=M.Topics),
            "post": _op("Create a static topic", ok="201", roles="admin", params=_WRITE[:], body=M.CreateTopic),
        },
        "/v1/topics/{topic}": {
            "get": _op("Describe a topic", params=[_p("topic"), *_READ], answer=M.TopicDetail),
            "patch": _op("Grow a topic", roles="admin", params=[_p("topic"), *_WRITE], body=M.GrowTopic),
            "delete": _op("Delete a topic", roles="admin", params=[_p("topic"), *_WRITE]),
        },
        "/v1/topics/{topic}/config": {"put": _op("Set config keys (null removes)", roles="admin",
                                                 params=[_p("topic"), *_WRITE], body=M.TopicConfig)},
        "/v1/topics/{topic}/remap": {"post": _op("Move queues to brokers (seal-then-switch)", roles="admin",
                                                 params=[_p("topic"), *_WRITE], body=M.Remap)},
        "/v1/topics/{topic}/elect": {"post": _op(
            "Elect leaders for queues whose leader is fenced and no in-sync copy took over; unclean: an out-of-sync "
            "copy, naming what may be lost", roles="admin", params=[_p("topic"), *_WRITE], body=M.Elect,
            answer=M.Elected)},
        "/v1/routes/{topic}": {"get": _op("Route, long poll (304 when unchanged after the wait)",
                                          params=[_p("topic"), _q("after"), _q("wait", "number")], answer=M.Route)},
        "/v1/watch": {"get": {"summary": "Server-sent events: one 'route' event per topic change, id = version",
                              "parameters": [_q("topics", "string"), _q("after"), *_READ],
                              "responses": {"200": {"description": "event stream",
                                                    "content": {"text/event-stream": {"schema": {"type": "string"}}}}}}},
        "/v1/history": {"get": _op("Events in version order, every version once; 503 HISTORY_UNAVAILABLE names a range "
                                   "this node holds in neither its image nor its projection yet",
                                   params=[_q("after"), _q("limit"), _q("topic", "string"), *_READ], answer=M.History)},
        "/v1/admin/image-digest": {"get": _op("SHA-256 of this node's image at its applied version", roles="admin",
                                              params=_READ, answer=M.ImageDigest)},
        "/v1/admin/image": {"get": {"summary": "This node's whole image as canonical JSON (headers X-Image-Version, "
                                               "X-Image-Sha256): a backup's source (roles: admin)", "parameters": _READ,
                                    "responses": {"200": {"description": "the image (meta/image.py)",
                                                          "content": {"application/json": {"schema": {"type": "object"}}}}}}},
        "/v1/groups": {"get": _op("List consumer groups", params=[
            _q("include", "string", "brokers: also the pull groups only brokers know, by their committed offsets "
               "(each group then says its source)"), *_READ], answer=M.Groups)},
        "/v1/groups/{group}": {"get": _op("A group's members, assignments, tokens, lease ends, committed offsets and "
                                          "lag (served by the leader)", params=[_p("group"), *_READ],
                                          answer=M.GroupDetail)},
        "/v1/groups/{group}/heartbeat": {"post": _op(
            "Join or renew a member; answers its owned queues with tokens and lease ends", params=[_p("group")],
            body=M.GroupHeartbeat, answer=M.GroupHeartbeatAnswer)},
        "/v1/groups/{group}/leave": {"post": _op("Leave: releases the member's locks at once",
                                                 params=[_p("group"), *_WRITE], body=M.LeaveGroup)},
        "/v1/groups/{group}/config": {"put": _op("Set group settings (null removes a key)", roles="admin",
                                                 params=[_p("group"), *_WRITE], body=M.GroupConfig)},
        "/healthz": {"get": _op("Alive", roles="none", answer=M.Health)},
        "/readyz": {"get": _op("Has a leader and caught up; projection_position, projection_gap_versions and "
                               "projection_complete say whether this node holds the whole history", roles="none",
                               answer=M.Ready)},
        "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "text"}}}},
        "/v1/openapi.json": {"get": {"summary": "This document", "responses": {"200": {"description": "spec"}}}},
    },
}
