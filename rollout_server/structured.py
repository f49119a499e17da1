"""Structured output: what the engine must enforce (a `GuidedDecoding`, engine/contract.py).

Dynamo 1.6.1's /v1/completions accepts vLLM's older guided-decoding fields
(guided_json, guided_regex, guided_choice, guided_grammar) but no structural tag, so
structural tags (tool calls, compact JSON) are sent as the xgrammar EBNF grammar they
compile to: the same language, enforced by the same backend.

Checking and compiling a constraint can take seconds for a large schema: it runs in the grammar compile
threads (`GrammarCache.off_the_loop`, bounded), never on the event loop, and what it makes is kept in the
grammar cache, bounded in bytes.
"""

from __future__ import annotations

import json

import xgrammar

from engine.contract import GuidedDecoding
from rollout_server.errors import bad_request
from rollout_server.tool_calls import GrammarCache
from rollout_server.tool_calls.request import json_schema_problem
from rollout_server.tool_calls.structural_tag import json_schema_content, xgrammar_reason


async def guided_for(grammars: GrammarCache, response_format: dict | None, structured_outputs: dict | None,
                     param_prefix: str = "") -> GuidedDecoding | None:
    """What the engine must enforce for a request's response_format or vLLM structured_outputs (one of them),
    checked and compiled in a grammar compile thread."""
    if structured_outputs is None and (not response_format or response_format.get("type") == "text"):
        return None  # nothing to check: no hand-off to a thread
    return await grammars.off_the_loop(_guided_for, grammars, response_format, structured_outputs, param_prefix)


def _guided_for(grammars: GrammarCache, response_format: dict | None, structured_outputs: dict | None,
                param_prefix: str) -> GuidedDecoding | None:
    if structured_outputs is not None and response_format and response_format.get("type") != "text":
        raise bad_request("response_format and structured_outputs both constrain the output: send one",
                          param=f"{param_prefix}structured_outputs")
    if structured_outputs is not None:
        return guided_for_structured_outputs(grammars, structured_outputs, f"{param_prefix}structured_outputs")
    return _guided_for_response_format(grammars, response_format, f"{param_prefix}response_format")


def _guided_for_response_format(grammars: GrammarCache, response_format: dict | None,
                                param: str = "response_format") -> GuidedDecoding | None:
    if not response_format or response_format.get("type") == "text":
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return GuidedDecoding("grammar", compact_json_grammar(grammars, {"type": "object"}, param))
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):
            raise bad_request("response_format.json_schema must be an object with a schema",
                              param=f"{param}.json_schema")
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise bad_request("response_format.json_schema.schema must be a JSON schema object",
                              param=f"{param}.json_schema.schema")
        return GuidedDecoding("grammar", compact_json_grammar(grammars, schema, f"{param}.json_schema.schema"))
    raise bad_request(f"response_format type {kind!r} is not supported (text, json_object, json_schema)",
                      param=f"{param}.type")


_STRUCTURED_KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


def guided_for_structured_outputs(grammars: GrammarCache, spec: dict, param: str) -> GuidedDecoding:
    """vLLM's structured_outputs (exactly one of json, json_object, regex, choice, grammar, structural_tag; its
    tuning options are the backend's business) -> Dynamo's guided fields, checked here so that a constraint
    the backend cannot compile is a 400 naming the field, not a failure mid-request."""
    kinds = [kind for kind in _STRUCTURED_KINDS if spec.get(kind) not in (None, False)]
    if len(kinds) != 1:
        raise bad_request(f"structured_outputs must set exactly one of {', '.join(_STRUCTURED_KINDS)}", param=param)
    kind = kinds[0]
    value, where = spec[kind], f"{param}.{kind}"
    if kind == "json_object":
        return GuidedDecoding("grammar", compact_json_grammar(grammars, {"type": "object"}, where))
    if kind == "json":
        schema = _json_value(value, where)
        if not isinstance(schema, dict):
            raise bad_request("structured_outputs.json must be a JSON schema object", param=where)
        return GuidedDecoding("grammar", compact_json_grammar(grammars, schema, where))
    if kind == "structural_tag":
        tag = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        return GuidedDecoding("grammar", _compiled(grammars.ebnf_of, tag, where))
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise bad_request("structured_outputs.choice must be a list of non-empty strings", param=where)
        return GuidedDecoding("choice", value)
    if not isinstance(value, str):
        raise bad_request(f"structured_outputs.{kind} must be a string", param=where)
    if kind == "regex":
        _compiled(xgrammar.Grammar.from_regex, value, where)
        return GuidedDecoding("regex", value)
    _compiled(xgrammar.Grammar.from_ebnf, value, where)
    return GuidedDecoding("grammar", value)


def _json_value(value, param: str):
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        raise bad_request("not valid JSON", param=param) from None


def _compiled(compile, source: str, param: str):
    try:
        return compile(source)
    except (RuntimeError, ValueError) as exc:
        raise bad_request(f"the constraint cannot be enforced: {xgrammar_reason(exc)}", param=param) from None


def compact_json_grammar(grammars: GrammarCache, schema: dict, param: str) -> str:
    """JSON for the schema with at most one whitespace character between tokens: a weak model
    cannot spend its max_tokens on indentation (plain guided_json allows any whitespace). Blocking."""
    if problem := grammars.memoized("schema-problem", json.dumps(schema, sort_keys=True), _schema_problem):
        raise bad_request(f"not a valid JSON Schema: {problem}", param=param)
    tag = {"type": "structural_tag", "format": json_schema_content(schema)}
    return _compiled(grammars.ebnf_of, json.dumps(tag, sort_keys=True), param)


def _schema_problem(schema_json: str) -> str | None:
    """Why the schema breaks its JSON Schema dialect's rules ($schema, else 2020-12), or None. xgrammar compiles
    some such schemas anyway: {"anyOf": []} becomes a grammar nothing matches, and its answers come back empty."""
    return json_schema_problem(json.loads(schema_json))
