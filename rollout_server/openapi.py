"""The front door's OpenAPI document (/openapi.json): every route it serves, with every status it can answer.

Rules:
- The document is generated from the code that serves, never written beside it. FastAPI describes its routes
  (`get_openapi`); each declares its error statuses where it is declared (`responses=error_responses(...)`,
  rollout_server/errors.py), and a route that reads its JSON body itself names the pydantic model it validates
  the body with (`openapi_extra=json_body(Model)`). The generation routes, served in front of FastAPI, are
  described from their table (rollout_server/generation_routes.py): each route's body model, and the statuses
  they answer.
- A body's schema is its model's JSON schema; the models it refers to ($defs) become the document's components.
- Every error status has one schema, the OpenAI error JSON (errors.ErrorBody).
- A validation error is a 400, never FastAPI's 422: the 422 FastAPI lists for a route with parameters or a body
  becomes the 400 that its validation answers.
- A body's schema says what its validation accepts, not only what its types do (`DocumentedModel`): what lax
  mode also takes, and what validators require of several fields together. A token id's schema says the
  served model's vocabulary size (`TOKEN_ID`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, GetJsonSchemaHandler
from pydantic_core import CoreSchema

from rollout_server.errors import ERROR_MEANINGS, ErrorBody

_COMPONENTS = "#/components/schemas/"
_FASTAPI_VALIDATION_SCHEMAS = ("HTTPValidationError", "ValidationError")  # its 422's body, which never comes


def install_openapi(app: FastAPI, generation_routes: Mapping[str, type[BaseModel]], generation_errors: Iterable[int],
                    vocab_size: int | None) -> None:
    """Serves the app's document at its /openapi.json, built on the first request for it. `generation_routes`:
    the path and body model of each generation route; `generation_errors`: the error statuses they answer;
    `vocab_size`: the served model's (None: token ids are not bounded)."""
    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = openapi_document(app, generation_routes, generation_errors, vocab_size)
        return app.openapi_schema

    app.openapi = openapi


def openapi_document(app: FastAPI, generation_routes: Mapping[str, type[BaseModel]], generation_errors: Iterable[int],
                     vocab_size: int | None = None) -> dict:
    # A copy: FastAPI's document holds the routes' own `openapi_extra` dicts, changed below
    document = copy.deepcopy(get_openapi(title=app.title, version=app.version, openapi_version=app.openapi_version,
                                         routes=app.routes))
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in _FASTAPI_VALIDATION_SCHEMAS:
        schemas.pop(name, None)
    schemas.setdefault(ErrorBody.__name__, _hoisted(_schema_of(ErrorBody), schemas))
    for path, body in generation_routes.items():
        document["paths"][path] = {"post": _generation_operation(path, body, generation_errors)}
    for operation in (op for methods in document["paths"].values() for op in methods.values()):
        if operation["responses"].pop("422", None) is not None:
            operation["responses"].setdefault("400", _error_response(400))
        for media in operation.get("requestBody", {}).get("content", {}).values():
            _hoisted(media.get("schema", {}), schemas)
    if vocab_size is not None:
        _bound_token_ids(document, vocab_size)
    return document


def json_body(model: type[BaseModel], required: bool = True) -> dict:
    """The `openapi_extra=` of a route that reads its JSON body itself and validates it with `model`.
    `required=False`: the route takes a request without a body (as an empty object)."""
    # The schema's $defs become components in openapi_document
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": _schema_of(model)}}}}


def _generation_operation(path: str, body: type[BaseModel], errors: Iterable[int]) -> dict:
    name = path.removeprefix("/").replace("/", "_").replace(".", "_")
    return {
        "summary": f"POST {path}",
        "operationId": name,
        **json_body(body),
        "responses": {
            "200": {"description": "The answer; with `stream: true`, its server-sent events.",
                    "content": {"application/json": {"schema": {}},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            **{str(status): _error_response(status) for status in errors},
        },
    }


def _error_response(status: int) -> dict:
    """As FastAPI writes a route's `responses=error_responses(status)`."""
    return {"description": ERROR_MEANINGS[status],
            "content": {"application/json": {"schema": {"$ref": _COMPONENTS + ErrorBody.__name__}}}}


def _bound_token_ids(node: Any, vocab_size: int) -> None:
    """Every token id's schema (TOKEN_ID) in `node` gets the vocabulary's last id as its maximum."""
    if isinstance(node, dict):
        if node.get("x-token-id"):
            node["maximum"] = vocab_size - 1
        children = node.values()
    else:
        children = node if isinstance(node, list) else ()
    for child in children:
        _bound_token_ids(child, vocab_size)


def _schema_of(model: type[BaseModel]) -> dict:
    """`model`'s JSON schema, with references to the models it holds as the document's components."""
    return model.model_json_schema(ref_template=_COMPONENTS + "{model}")


def _hoisted(schema: dict, schemas: dict) -> dict:
    """`schema` without its $defs, which join the document's components (FastAPI's own, if there, stay)."""
    for name, definition in schema.pop("$defs", {}).items():
        schemas.setdefault(name, definition)
    return schema


# ---- Schemas that say what validation accepts ----------------------------------------------------------

# What lax mode reads as a boolean besides one: 0 and 1, and these words in any case ("True" as Python writes it)
_FALSE_WORDS, _TRUE_WORDS = ("0", "f", "n", "no", "off", "false"), ("1", "t", "y", "yes", "on", "true")


def _spelled(words: tuple[str, ...]) -> list[str]:
    return sorted({spelling for word in words for spelling in (word, word.upper(), word.capitalize())})


LAX_FALSE = {"enum": [False, 0, *_spelled(_FALSE_WORDS)]}  # every value a boolean field reads as false
LAX_TRUE = {"enum": [True, 1, *_spelled(_TRUE_WORDS)]}
_LAX_BOOLEAN = [*LAX_FALSE["enum"], *LAX_TRUE["enum"]]
_ANNOTATIONS = ("title", "description", "default")  # stay on a field's schema when its type's is widened

# A token id's schema: the document adds the served model's vocabulary size as its bound (`openapi_document`)
TOKEN_ID = {"type": "integer", "minimum": 0, "x-token-id": True}


class DocumentedModel(BaseModel):
    """A request body whose JSON schema says what its validation accepts, not only what its types do.

    - Lax mode: a boolean field also takes 0 and 1 and their words (LAX_FALSE, LAX_TRUE); an integer or number
      field also takes false and true (0 and 1) where its bounds do. A number sent as text ("0.7") is read too,
      within the same bounds, which no schema keyword can say: the schema leaves text out.
    - `schema_rules`: what validators require of several fields together, each a JSON schema the body must
      satisfy, declared beside the validator; a class has its bases' rules too.
    """

    schema_rules: ClassVar[tuple[dict, ...]] = ()

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> dict:
        schema = handler.resolve_ref_schema(handler(core_schema))
        widened = _lax(schema)
        rules = [rule for klass in reversed(cls.__mro__) for rule in vars(klass).get("schema_rules", ())]
        schema.clear()
        schema.update(widened, **({"allOf": rules} if rules else {}))
        return schema


def _lax(node: Any) -> Any:
    """`node` (a JSON schema) with every boolean, integer and number schema in it widened as lax mode reads."""
    if not isinstance(node, dict):
        return node
    node = {key: _lax_subschemas(key, value) for key, value in node.items()}
    if "enum" in node or "const" in node:  # it lists its values itself
        return node
    if node.get("type") == "boolean":
        return {**{key: value for key, value in node.items() if key != "type"}, "enum": _LAX_BOOLEAN}
    if node.get("type") in ("integer", "number"):
        booleans = [value for value in (False, True) if _within_bounds(node, int(value))]
        if booleans:
            annotations = {key: node.pop(key) for key in _ANNOTATIONS if key in node}
            return {**annotations, "anyOf": [node, {"enum": booleans}]}
    if "anyOf" in node:  # a union of widened types: one flat list of alternatives
        node["anyOf"] = [alternative for branch in node["anyOf"]
                         for alternative in (branch["anyOf"] if set(branch) == {"anyOf"} else [branch])]
    return node


def _lax_subschemas(keyword: str, value: Any) -> Any:
    if keyword in ("properties", "patternProperties", "$defs"):
        return {name: _lax(schema) for name, schema in value.items()}
    if keyword in ("items", "additionalProperties", "not"):
        return _lax(value)
    if keyword in ("anyOf", "oneOf", "allOf", "prefixItems"):
        return [_lax(schema) for schema in value]
    return value


def _within_bounds(schema: dict, value: int) -> bool:
    return (schema.get("minimum", value) <= value <= schema.get("maximum", value)
            and schema.get("exclusiveMinimum", value - 1) < value < schema.get("exclusiveMaximum", value + 1))
