"""What one request may ask of the front door: each limit a setting (`limits`, rollout_server/settings.py), each
refusal a 400 naming the field, checked before the work it bounds is done.

- prompts per completions request: every prompt becomes an engine request of its own;
- n x max_tokens per generation: the tokens one request may have sampled (with an unset max_tokens, the room
  the context leaves); n alone is at most 64 (protocol.py);
- tools per request and each tool's size as compact JSON: both are rendered into the prompt and compiled
  into a grammar;
- a session id's length (X-Session-ID, the body's session_id, and `user`, which names the session when
  nothing else does): session ids are kept in memory, as pins and as prompts;
- the nesting of a JSON body: checked on its bytes, before it is parsed (rollout_server/fast_json.py), since
  code that walks values recursively fails on deep ones.
"""

from __future__ import annotations

import json

from rollout_server.errors import bad_request
from rollout_server.settings import LimitSettings


def check_prompt_count(limits: LimitSettings, count: int) -> None:
    if count > limits.max_prompts:
        raise bad_request(f"{count} prompts in one request; this server takes at most {limits.max_prompts} "
                          f"(setting limits_max_prompts): send them in several requests", param="prompt",
                          code="too_many_prompts")


def check_sampled_tokens(limits: LimitSettings, n: int, max_tokens: int, param: str) -> None:
    """`max_tokens`: the generation's, as served (the request's, else the room its context leaves)."""
    if n * max_tokens > limits.max_sampled_tokens:
        raise bad_request(f"n x max_tokens is {n} x {max_tokens} = {n * max_tokens} tokens; this server samples at "
                          f"most {limits.max_sampled_tokens} for one request (setting limits_max_sampled_tokens): "
                          f"lower n or max_tokens", param=param, code="too_many_tokens")


def check_tools(limits: LimitSettings, tools: list) -> None:
    if len(tools) > limits.max_tools:
        raise bad_request(f"{len(tools)} tools in one request; this server takes at most {limits.max_tools} "
                          f"(setting limits_max_tools)", param="tools", code="too_many_tools")
    for i, tool in enumerate(tools):
        size = len(json.dumps(tool, ensure_ascii=False, separators=(",", ":")).encode())
        if size > limits.max_tool_schema_bytes:
            raise bad_request(f"tool {i} is {size} bytes as compact JSON; this server takes at most "
                              f"{limits.max_tool_schema_bytes} a tool (setting limits_max_tool_schema_bytes)",
                              param=f"tools.{i}", code="tool_too_large")


def check_session_ids(limits: LimitSettings, **ids: str | None) -> None:
    """Each id given (by its parameter's name: x_session_id for the header) within the length limit."""
    for name, value in ids.items():
        if value is not None and len(value) > limits.max_session_id_chars:
            param = "x-session-id" if name == "x_session_id" else name
            raise bad_request(f"{param} is {len(value)} characters; this server takes at most "
                              f"{limits.max_session_id_chars} (setting limits_max_session_id_chars)", param=param,
                              code="session_id_too_long")
