"""Which JSON Schema keywords of a tool's parameters the grammar enforces, and what happens to the others.

The rule: every keyword a tool's `parameters` use is in exactly one class.
- GRAMMAR: xgrammar compiles it into the grammar, so the model cannot write arguments that break it.
- CHECKED: the grammar cannot express it (uniqueness, exclusive alternatives, conditionals, ...). The finished
  call is validated against the whole schema; a call that fails is sampled again from just before it, a
  bounded number of times (rollout_server/tool_calls/argument_check.py, docs/tool_calls.md).
- Under OpenAI's `"strict": true` on a function, a CHECKED keyword is refused up front: 400, the keyword
  named with its place in the schema, since strict promises arguments valid by construction.
- ANNOTATIONS (title, description, ...) constrain nothing. A keyword no JSON Schema dialect defines is
  ignored by validators, so it is an annotation too.

Each class assignment was measured against xgrammar 0.2.8 (tests/tool_calls/test_schema_keywords.py compiles a
schema per keyword and checks that the grammar refuses a breaking value, or that it does not): when a new
xgrammar enforces more, those tests say which keyword to move.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rollout_server.tool_calls.request import NO_PARAMETERS, ToolRequestError

GRAMMAR = frozenset({
    "type", "properties", "required", "additionalProperties", "unevaluatedProperties", "minProperties",
    "maxProperties",
    "items", "prefixItems", "minItems", "maxItems",
    "enum", "const", "anyOf", "$ref", "$defs", "definitions",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "pattern", "format", "maxLength", "multipleOf",
})

CHECKED = frozenset({
    "uniqueItems", "oneOf", "allOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
    "contains", "minContains", "maxContains", "unevaluatedItems", "minLength",
    # The grammar writes only the properties a schema declares by name (xgrammar's strict mode) and does not hold
    # them to these: keys that only a pattern admits are never written, declared ones are checked after.
    "patternProperties", "propertyNames",
})

ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly", "$schema", "$id",
    "$anchor", "$comment", "contentMediaType", "contentEncoding", "contentSchema",
})

# `format` values xgrammar 0.2.8 turns into a grammar; any other format (regex, idn-email, a made-up one) is
# checked after, by a validator that knows it (and passes formats it does not know, as JSON Schema says).
GRAMMAR_FORMATS = frozenset({
    "email", "date", "time", "date-time", "duration", "uuid", "ipv4", "ipv6", "hostname", "uri",
    "uri-reference", "uri-template", "json-pointer", "relative-json-pointer",
})

# String lengths in xgrammar 0.2.8: a JSON string with minLength or maxLength compiles to a rule that admits no
# escape sequence (no quote, backslash or newline could be written), so the Hermes format, which writes
# arguments as JSON, leaves both out of its grammar. The XML style writes strings raw: its grammar enforces
# maxLength, but lets any non-empty string through minLength. So minLength is always checked, maxLength in JSON.
STRING_LENGTHS = frozenset({"minLength", "maxLength"})

# Where subschemas sit, by keyword: a map of them, a list of them, or one.
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_VALUES = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
                     "unevaluatedProperties", "unevaluatedItems")


@dataclass(frozen=True)
class Unenforced:
    """A keyword the grammar does not enforce, and where: `path` leads from `parameters` to the keyword."""

    keyword: str
    path: str


def unenforced_keywords(schema: Any, json_strings: bool) -> list[Unenforced]:
    """The CHECKED keywords of `schema` in every subschema. `json_strings`: the format writes arguments as JSON
    (maxLength is then checked, not enforced)."""
    return list(_walk(schema, "", json_strings))


def refuse_unenforced_in_strict_tools(tools: list[dict], json_strings: bool) -> None:
    """A 400 (ToolRequestError) naming the first keyword a `"strict": true` function's parameters use that the
    grammar cannot enforce. Call after validate_tool_request."""
    for i, tool in enumerate(tools or ()):
        function = tool["function"]
        if function.get("strict") is not True:
            continue
        unenforced = unenforced_keywords(function.get("parameters") or NO_PARAMETERS, json_strings)
        if unenforced:
            first = unenforced[0]
            raise ToolRequestError(
                f"function '{function['name']}' is strict, and its parameters use '{first.keyword}' (at "
                f"{first.path}), which this server checks on the finished call but cannot enforce while sampling; "
                "drop the keyword or set strict to false (docs/tool_calls.md lists what is enforced)",
                f"tools[{i}].function.parameters.{first.path}")


def grammar_schema(schema: Any, json_strings: bool) -> Any:
    """The schema the grammar is compiled from: as much of `schema` as xgrammar can enforce, and never less than
    the schema allows (the check after sampling catches what it lets through). Three rewrites, each exact:
    - JSON-style arguments lose minLength/maxLength (they would forbid escape sequences);
    - `allOf` (which xgrammar ignores) is folded into the schema where its parts combine plainly: keywords only
      one part sets, equal values, the tighter of two bounds, the union of `required`;
    - a `dependentRequired` whose trigger is itself required makes its dependents required."""
    if not isinstance(schema, dict):
        return schema
    kept = {key: value for key, value in schema.items() if not (json_strings and key in STRING_LENGTHS)}
    for key in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            kept[key] = {name: grammar_schema(sub, json_strings) for name, sub in schema[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            kept[key] = [grammar_schema(sub, json_strings) for sub in schema[key]]
    for key in _SUBSCHEMA_VALUES:
        if isinstance(schema.get(key), dict):
            kept[key] = grammar_schema(schema[key], json_strings)
    if isinstance(kept.get("allOf"), list) and all(isinstance(part, dict) for part in kept["allOf"]):
        kept = _folded(kept)
    required = kept.get("required")
    if isinstance(required, list) and isinstance(kept.get("dependentRequired"), dict):
        implied = [name for trigger in required for name in kept["dependentRequired"].get(trigger, ())]
        kept["required"] = list(dict.fromkeys([*required, *implied]))
    return kept


# Bounds two parts of an allOf may both set: the tighter one holds.
_LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minItems", "minLength", "minProperties")
_UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxItems", "maxLength", "maxProperties")


def _folded(schema: dict) -> dict:
    """`schema` with its allOf parts merged into it; a keyword two parts set differently (other than a bound,
    `required`, or `properties` naming different properties) is left out: the grammar then allows more, and the
    check after sampling decides."""
    merged = {key: value for key, value in schema.items() if key != "allOf"}
    conflicts: set[str] = set()
    for part in schema["allOf"]:
        for key, value in part.items():
            if key not in merged or merged[key] == value:
                merged[key] = value
            elif key == "required":
                merged[key] = list(dict.fromkeys([*merged[key], *value]))
            elif key == "properties" and not {n for n in merged[key].keys() & value.keys() if merged[key][n] != value[n]}:
                merged[key] = {**merged[key], **value}
            elif key in _LOWER_BOUNDS:
                merged[key] = max(merged[key], value)
            elif key in _UPPER_BOUNDS:
                merged[key] = min(merged[key], value)
            else:
                conflicts.add(key)
    return {key: value for key, value in merged.items() if key not in conflicts}


def _walk(schema: Any, path: str, json_strings: bool) -> Iterator[Unenforced]:
    if not isinstance(schema, dict):
        return
    for keyword, value in schema.items():
        if _is_checked(keyword, value, schema, json_strings):
            yield Unenforced(keyword, _join(path, keyword))
    for key, sub, where in _children(schema):
        yield from _walk(sub, _join(path, key, where), json_strings)


def _is_checked(keyword: str, value: Any, schema: dict, json_strings: bool) -> bool:
    if keyword in CHECKED:
        return True
    if keyword == "maxLength":
        return json_strings
    if keyword == "format":
        return value not in GRAMMAR_FORMATS
    if keyword == "multipleOf":  # xgrammar enforces it on integers only
        return not (schema.get("type") == "integer" and isinstance(value, int))
    return False


def _children(schema: dict) -> Iterator[tuple[str, Any, Any]]:
    """(keyword, subschema, its key or index) for every subschema directly under `schema`."""
    for key in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                yield key, sub, name
    for key in _SUBSCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for index, sub in enumerate(schema[key]):
                yield key, sub, index
    for key in _SUBSCHEMA_VALUES:
        if isinstance(schema.get(key), dict):
            yield key, schema[key], None


def _join(path: str, key: str, where: Any = None) -> str:
    step = key if where is None else f"{key}.{where}" if isinstance(where, str) else f"{key}[{where}]"
    return f"{path}.{step}" if path else step
