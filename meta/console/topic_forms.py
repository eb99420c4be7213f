"""The console's topic forms (admin): create a topic, grow it, set and unset its config, delete it. Each is one call
of the node's API (``POST /v1/topics``, ``PATCH``, ``PUT .../config``, ``DELETE``), made once with the session's
token; a refusal goes back to the page it came from, shown on the form that was sent (``?form=``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from aiohttp import web

from wire.errors import invalid

from .pages import (back_to, checked_form, console_page, form_whole, name_param, refusals_on_the_form,
                    submit_change)

CONFIG_LINES_MAX = 100        # key=value lines one config form sets


@console_page("admin")
async def create_topic(request: web.Request) -> web.Response:
    form = await checked_form(request)
    with refusals_on_the_form(request, "/console/topics?form=create"):
        topic = str(form.get("topic", "")).strip()
        if not topic:
            raise invalid("name the topic")
        body: dict[str, Any] = {"topic": topic, "queues": form_whole(form, "queues", required=True)}
        for key in ("replicas", "min_insync", "slots"):
            if (value := form_whole(form, key)) is not None:
                body[key] = value
        brokers = [str(b) for b in form.getall("brokers", [])]
        if brokers:
            body["brokers"] = brokers
        if str(form.get("order", "")).strip():
            body["order"] = str(form["order"]).strip()
        scope = str(form.get("scope", "")).strip()
        if scope:
            body["scope"] = scope if scope == "global" else [c.strip() for c in scope.split(",") if c.strip()]
        answer = await submit_change(request, "POST", "/v1/topics", body)
    back_to(f"/console/topics/{quote(topic)}", f"created at v{answer['version']}", answer["version"])


async def _topic_form(request: web.Request, form_name: str, method: str, suffix: str,
                      body: Callable[[Any], dict[str, Any]], said: Callable[[dict[str, Any]], str]) -> None:
    """One form of a topic's page: ``body`` of the posted form to ``method`` the topic's path (plus ``suffix``),
    back to the page with what ``said`` makes of the answer, or with the refusal on the form."""
    form = await checked_form(request)
    topic = name_param(request.match_info["topic"])
    page = f"/console/topics/{quote(topic)}"
    with refusals_on_the_form(request, f"{page}?form={form_name}"):
        answer = await submit_change(request, method, f"/v1/topics/{quote(topic)}{suffix}", body(form))
    back_to(page, said(answer), answer["version"])


@console_page("admin")
async def grow_topic(request: web.Request) -> web.Response:
    await _topic_form(request, "grow", "PATCH", "", lambda form: {"queues": form_whole(form, "queues", required=True)},
                      lambda a: f"grown to {a.get('queues')} queues at v{a['version']}")


def config_change(set_lines: str, unset: str) -> dict[str, str | None]:
    """The config form's fields as one merge: ``key=value`` lines set, the names in ``unset`` removed (null)."""
    change: dict[str, str | None] = {}
    lines = [line.strip() for line in set_lines.splitlines() if line.strip()]
    if len(lines) > CONFIG_LINES_MAX:
        raise invalid(f"at most {CONFIG_LINES_MAX} key=value lines")
    for line in lines:
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise invalid(f"{line[:60]!r} is not key=value")
        change[key.strip()] = value.strip()
    for key in unset.replace(",", " ").split():
        change[key] = None
    if not change:
        raise invalid("nothing to set or unset")
    return change


@console_page("admin")
async def set_config(request: web.Request) -> web.Response:
    await _topic_form(request, "config", "PUT", "/config",
                      lambda form: config_change(str(form.get("set", "")), str(form.get("unset", ""))),
                      lambda a: f"config saved at v{a['version']}")


@console_page("admin")
async def delete_topic(request: web.Request) -> web.Response:
    """Deleting needs the topic's name typed again, as a confirmation."""
    form = await checked_form(request)
    topic = name_param(request.match_info["topic"])
    with refusals_on_the_form(request, f"/console/topics/{quote(topic)}?form=delete"):
        if str(form.get("confirm", "")).strip() != topic:
            raise invalid(f"type the topic's name, {topic}, to delete it")
        answer = await submit_change(request, "DELETE", f"/v1/topics/{quote(topic)}")
    back_to("/console/topics", f"{topic} deleted at v{answer['version']}", answer["version"])


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_post("/console/topics", create_topic)
    r.add_post("/console/topics/{topic}/grow", grow_topic)
    r.add_post("/console/topics/{topic}/config", set_config)
    r.add_post("/console/topics/{topic}/delete", delete_topic)
