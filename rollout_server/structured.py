"""Structured output: what the engine must enforce, as Dynamo's completions API takes it.

Dynamo 1.6.1's /v1/completions accepts vLLM's guided-decoding fields (guided_json,
guided_grammar, ...) but no structural tag, so structural tags (tool calls, compact
JSON) are sent as the xgrammar EBNF grammar they compile to: the same language,
enforced by the same backend.
"""

from __future__ import annotations

import json
from functools import lru_cache

import xgrammar

from rollout_server.errors import bad_request
from rollout_server.tool_calls.structural_tag import json_schema_content


def guided_for_response_format(response_format: dict | None, param: str = "response_format") -> dict:
    if not response_format or response_format.get("type") == "text":
        return {}
    kind = response_format.get("type")
    if kind == "json_object":
        return {"guided_grammar": compact_json_grammar({"type": "object"}, param)}
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise bad_request("response_format.json_schema.schema must be a JSON schema object",
                              param=f"{param}.json_schema.schema")
        return {"guided_grammar": compact_json_grammar(schema, f"{param}.json_schema.schema")}
    raise bad_request(f"response_format type {kind!r} is not supported (text, json_object, json_schema)",
                      param=f"{param}.type")


@lru_cache(maxsize=512)
def grammar_for_structural_tag(structural_tag_json: str) -> str:
    """The EBNF grammar of an xgrammar structural tag (cached: agents resend the same tools)."""
    return str(xgrammar.Grammar.from_structural_tag(structural_tag_json))


def compact_json_grammar(schema: dict, param: str) -> str:
    """JSON for the schema with at most one whitespace character between tokens: a weak model
    cannot spend its max_tokens on indentation (plain guided_json allows any whitespace)."""
    tag = {"type": "structural_tag", "format": json_schema_content(schema)}
    try:
        return grammar_for_structural_tag(json.dumps(tag, sort_keys=True))
    except (RuntimeError, ValueError) as exc:
        raise bad_request(f"the JSON schema cannot be enforced: {exc}", param=param) from None
