"""Body shapes as typed models, for both services: validate a request body with one, and render its JSON Schema
into an OpenAPI document's components. meta/api/models.py and broker/api/models.py hold the models; their
openapi.py files build the spec from them, so a spec cannot drift from what the handlers check."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict

from wire.errors import invalid

STRICT = ConfigDict(extra="forbid", strict=True)   # requests: no coercion, unknown fields refused by name
OPEN = ConfigDict(extra="allow")                   # answers: they may grow fields (API.md: add, never rename)
REF = "#/components/schemas/{model}"


@with_config(OPEN)
class ErrorBody(TypedDict):
    code: str
    message: str
    details: dict[str, Any]


@with_config(OPEN)
class Error(TypedDict):
    """Every error answer of both services (API.md's error shape; errors.py renders it)."""
    error: ErrorBody


_ADAPTERS: dict[int, tuple[Any, TypeAdapter]] = {}   # id(model) -> (model, its adapter): models live for ever


def adapter(model: Any) -> TypeAdapter:
    # By identity, not lru_cache: hashing an Annotated alias (most request models) walks its metadata on every
    # request (~0.5% of a node's CPU at 64 writers). The model is kept with its adapter, so its id stays its own.
    found = _ADAPTERS.get(id(model))
    if found is None or found[0] is not model:
        found = _ADAPTERS[id(model)] = (model, TypeAdapter(model))
    return found[1]


def validate(model: Any, body: Any) -> Any:
    """``body`` if it has ``model``'s shape, else 400 INVALID_ARGUMENT naming the first field that does not."""
    try:
        adapter(model).validate_python(body)
    except ValidationError as e:
        first = e.errors(include_url=False, include_input=False)[0]
        field = ".".join(str(p) for p in first["loc"]) or "body"
        if first["type"] == "extra_forbidden":
            raise invalid(f"unknown field {field!r}", field=field) from None
        raise invalid(f"{field}: {first['msg']}", field=field) from None
    return body


class SpecSchemas:
    """The components/schemas of one OpenAPI document, filled as operations name their models (a class's name, or
    the ``title`` of an Annotated alias)."""

    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {}

    def ref(self, model: Any) -> dict[str, str]:
        schema = adapter(model).json_schema(ref_template=REF)
        self.schemas.update(schema.pop("$defs", {}))
        name = schema["title"]
        self.schemas[name] = schema
        return {"$ref": REF.format(model=name)}

    def content(self, model: Any) -> dict[str, Any]:
        return {"application/json": {"schema": self.ref(model)}}
