"""Request bodies of the OpenAI-compatible API, validated.

Pydantic's lax mode coerces "true" -> True and "0.7" -> 0.7, as vLLM does: verifiers
sends sampling keys from its command line as strings. Unknown fields are ignored
(vLLM's behaviour), wrong types and out-of-range values are a 400 naming the field.
A field vLLM knows whose effect this server cannot give is refused when set (400,
the field named), never served as if it were not there.

The JSON schema of each model (the OpenAPI document's) says what its validators accept,
not only what its types do (rollout_server/openapi.py, DocumentedModel); it changes
nothing that validates.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, NonNegativeInt, WithJsonSchema, field_validator

from rollout_server.openapi import LAX_FALSE, LAX_TRUE, TOKEN_ID, DocumentedModel
from rollout_server.tool_calls.request import FUNCTION_NAME

# vLLM request fields whose effect this server cannot give: Dynamo's completions API does not carry them to
# the engine, or the engine path does not return them. The request classes declare the ones they take.
CANNOT_APPLY = {
    "logit_bias": "its engine path does not apply it",
    "allowed_token_ids": "its engine path does not apply it",
    "bad_words": "its engine path does not apply it",
    "prompt_logprobs": "the engine does not return prompt logprobs",
    "logprob_token_ids": "the engine returns the top logprobs only (top_logprobs)",
    "use_beam_search": "no beam search",
    "priority": "priority scheduling is not enabled",
    "truncate_prompt_tokens": "prompts are never truncated (shorten the prompt)",
    "repetition_detection": "its engine path does not apply it",
    "watermarking": "its engine path does not apply it",
    "chat_template": "the model's own template renders every request (its tool-call format depends on it)",
    "prompt_embeds": "prompts are text or token ids",
}


# A field of CANNOT_APPLY, as its schema says it: only a value that asks for nothing (`_cannot_apply`)
Refused = Annotated[Any, WithJsonSchema({"anyOf": [
    {"type": "null"}, {"const": False}, {"const": 0}, {"const": ""},
    {"type": "array", "maxItems": 0}, {"type": "object", "maxProperties": 0},
]})]
TokenId = Annotated[NonNegativeInt, WithJsonSchema(TOKEN_ID)]  # checked against the vocabulary when served


# Dynamo's completions API carries every generation to the engine; these are its limits, checked here so that a
# value past them is a 400 naming the client's field, not Dynamo's message with no field.
MAX_LOGPROBS = 5                  # alternatives per position (OpenAI's completions limit)
MAX_STOP_TOKEN_IDS = 32
MAX_REPETITION_PENALTY = 2.0
MAX_INT32 = 2**31 - 1             # top_k and the stream interval are 32-bit integers on the engine's way


class _Request(DocumentedModel):
    # inf and NaN are refused: JSON has neither, and the engine would be sent null (the field silently ignored)
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @field_validator(*CANNOT_APPLY, check_fields=False)
    @classmethod
    def _cannot_apply(cls, v, info):
        """A value that asks for something (not null, false, 0 or empty) is refused, never ignored."""
        if v:
            raise ValueError(f"{info.field_name} is not supported by this server: {CANNOT_APPLY[info.field_name]}")
        return v


class SamplingFields(_Request):
    """Sampling knobs shared by every generation endpoint."""

    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, le=MAX_INT32)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    n: int = Field(1, ge=1, le=64)
    seed: int | None = Field(None, ge=-2**63, le=2**63 - 1)
    stop: str | list[str] | None = Field(None, json_schema_extra={"anyOf": [  # _stop_list
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 16},
        {"type": "null"},
    ]})
    stop_token_ids: list[NonNegativeInt] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=MAX_REPETITION_PENALTY)
    min_tokens: NonNegativeInt | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    user: str | None = None
    include_stop_str_in_output: bool | None = None
    structured_outputs: dict[str, Any] | None = None   # vLLM's: one of json, regex, choice, grammar, ...
    cache_salt: str | None = Field(None, min_length=1)  # requests share cached KV only with the same salt
    # Staleness (docs/deploy.md): end the request, with its tokens so far, once the weights sampling it are more
    # than this many versions past its first token's; serve it only on workers at this version or newer.
    max_policy_lag: NonNegativeInt | None = None
    min_policy_version: NonNegativeInt | None = None

    logit_bias: Refused = None                         # CANNOT_APPLY: refused when set, never passed on
    allowed_token_ids: Refused = None
    bad_words: Refused = None
    prompt_logprobs: Refused = None
    logprob_token_ids: Refused = None
    use_beam_search: Refused = None
    priority: Refused = None
    truncate_prompt_tokens: Refused = None
    repetition_detection: Refused = None
    watermarking: Refused = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v):
        if isinstance(v, str):
            v = [v]
        if v == []:
            return None  # no stop sequence (the engine refuses an empty list)
        if v is not None and len(v) > 16:
            raise ValueError("at most 16 stop sequences")
        if v is not None and "" in v:
            raise ValueError("a stop sequence must not be empty")
        return v


class StreamOptions(_Request):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage so far in every chunk too

    def usage_in_every_chunk(self) -> bool:
        return self.include_usage and self.continuous_usage_stats


# A call in an assistant's history, as the chat template renders it: its function's arguments, an object or its JSON
_HISTORY_TOOL_CALL = {"type": "object", "required": ["function"], "properties": {"function": {
    "type": "object", "required": ["arguments"], "properties": {"arguments": {"anyOf": [
        {"type": "object"},
        {"type": "string", "contentMediaType": "application/json", "contentSchema": {"type": "object"}},
    ]}}}}}


class ChatMessage(_Request):
    model_config = ConfigDict(extra="allow")
    schema_rules = ({"anyOf": [  # the template renders an assistant's tool_calls only
        {"properties": {"role": {"not": {"const": "assistant"}}}},
        {"properties": {"tool_calls": {"anyOf": [{"type": "null"}, {"type": "array", "items": _HISTORY_TOOL_CALL}]}}},
    ]},)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = Field(None, json_schema_extra={"anyOf": [  # text()
        {"type": "string"},
        {"type": "array", "items": {"type": "object", "required": ["type", "text"],
                                    "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}},
        {"type": "null"},
    ]})
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def text(self) -> str | None:
        """Content as plain text: text parts joined; other part types are refused."""
        if self.content is None or isinstance(self.content, str):
            return self.content
        texts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"content part of type {part.get('type')!r} is not supported (text only)")
            texts.append(part["text"])
        return "".join(texts)


# Arguments of the template rendering call that chat_template_kwargs must not override.
_RENDER_ARGUMENTS = {"messages", "conversation", "tools", "documents", "chat_template", "tokenize", "return_dict",
                     "add_generation_prompt", "continue_final_message", "tokenizer_kwargs", "return_tensors",
                     "padding", "truncation", "max_length", "return_assistant_tokens_mask"}


# Tools as the tool checks take them (rollout_server/tool_calls/request.py, when a conversation is rendered): each a
# function with a name, and parameters that are a JSON schema of an object. A name must not repeat, which no schema
# keyword can say.
_FUNCTION_TOOLS = {"properties": {"tools": {"anyOf": [{"type": "null"}, {"type": "array", "items": {
    "type": "object", "required": ["type", "function"], "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string", "pattern": f"^{FUNCTION_NAME.pattern}$"},
            "parameters": {"anyOf": [
                {"type": "null"}, {"type": "object", "properties": {"type": {"const": "object"}}}]},
        }},
    }}}]}}}


class ChatTemplateFields(_Request):
    """What the model's chat template renders a conversation with: chat completions and /tokenize."""

    schema_rules = ({"anyOf": [  # _one_way_to_end
        {"properties": {"continue_final_message": LAX_FALSE}},
        {"properties": {"add_generation_prompt": LAX_FALSE}, "required": ["add_generation_prompt"]},
    ]},)

    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = Field(None, json_schema_extra={"anyOf": [  # extra template variables
        {"type": "object", "propertyNames": {"not": {"enum": sorted(_RENDER_ARGUMENTS)}}}, {"type": "null"}]})
    documents: list[dict[str, Any]] | None = None
    chat_template: Refused = None                       # CANNOT_APPLY: refused when set

    @field_validator("continue_final_message")
    @classmethod
    def _one_way_to_end(cls, v, info):
        if v and info.data.get("add_generation_prompt"):
            raise ValueError("continue_final_message needs add_generation_prompt set to false (the answer either "
                             "continues the last message or starts a new one)")
        return v

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables_only(cls, v):
        taken = sorted(set(v or {}) & _RENDER_ARGUMENTS)
        if taken:
            raise ValueError(f"{', '.join(taken)} cannot be set here (request fields of their own, or the server's)")
        return v


class ChatCompletionRequest(SamplingFields, ChatTemplateFields):
    schema_rules = (_FUNCTION_TOOLS, {"anyOf": [  # _needs_logprobs
        {"properties": {"top_logprobs": {"enum": [None, 0, False]}}},
        {"properties": {"logprobs": LAX_TRUE}, "required": ["logprobs"]},
    ]})

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stream_interval: int | None = Field(None, ge=1, le=MAX_INT32)  # tokens per streamed message (else the server's)
    session_id: str | None = None                       # as X-Session-ID (the header wins)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    return_tokens_as_token_ids: bool = False
    return_token_ids: bool = False
    add_special_tokens: bool = False                    # the tokenizer's (a BOS) on top of the template's, as vLLM
    echo: Annotated[bool, WithJsonSchema(LAX_FALSE)] = False  # vLLM's chat echo: refused when set (completions')

    @field_validator("echo")
    @classmethod
    def _no_chat_echo(cls, v):
        if v:
            raise ValueError("echo is not supported by this server on chat completions (it is on completions)")
        return v

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, v, info):
        if v and not info.data.get("logprobs"):
            raise ValueError("top_logprobs requires logprobs to be true")
        return v


class CompletionRequest(SamplingFields):
    model: str
    # Ids before texts: the same choice (smart mode takes the exact match), but an id prompt tried as texts first
    # makes a validation error per id before it matches (docs/benchmarks.md, "Measurements behind design choices")
    prompt: str | list[int] | list[list[int]] | list[str] = Field(json_schema_extra={"anyOf": [  # _non_empty
        {"type": "string", "minLength": 1},  # "" is refused when served (completions.py)
        {"type": "array", "items": TOKEN_ID, "minItems": 1},
        {"type": "array", "items": {"type": "array", "items": TOKEN_ID, "minItems": 1}, "minItems": 1},
        {"type": "array", "items": {"type": "string"}, "minItems": 1},
    ]})
    max_tokens: int | None = Field(16, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stream_interval: int | None = Field(None, ge=1, le=MAX_INT32)
    session_id: str | None = None
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    add_special_tokens: bool = True                     # for text prompts: the tokenizer's own (a BOS), as vLLM
    suffix: str | None = None
    return_tokens_as_token_ids: bool = False
    return_token_ids: bool = False
    response_format: dict[str, Any] | None = None
    prompt_embeds: Refused = None                       # CANNOT_APPLY: refused when set

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v):
        # The union's lists are uniform: only a list of lists needs its items looked at (not 140k token ids)
        if isinstance(v, list) and (not v or (isinstance(v[0], list) and not all(v))):
            raise ValueError("prompt must not be empty")
        return v


class GenerateSamplingParams(SamplingFields):
    """vLLM SamplingParams, as verifiers' train mode sends them."""

    max_tokens: int | None = Field(None, ge=1)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


class GenerateRequest(_Request):
    """POST /inference/v1/generate: token ids in, token ids and logprobs out."""

    model: str
    token_ids: list[TokenId] = Field(min_length=1)
    sampling_params: GenerateSamplingParams = Field(default_factory=GenerateSamplingParams)
    request_id: str | None = Field(None, min_length=1, max_length=256)
    stream: bool = False


class TokenizeRequest(ChatTemplateFields):
    """vLLM's POST /tokenize: a text prompt, or a conversation rendered as chat completions render it."""

    schema_rules = (
        {"oneOf": [  # _prompt_or_messages
            {"properties": {"prompt": {"type": "string"}}, "required": ["prompt"]},
            {"properties": {"messages": {"type": "array"}}, "required": ["messages"]},
        ]},
        {"anyOf": [{"properties": {"messages": {"type": "null"}}}, _FUNCTION_TOOLS]},  # a conversation's tools
    )

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1, validate_default=True)
    add_special_tokens: bool | None = None  # default as vLLM: yes for a prompt, no for messages (the template's own)
    return_token_strs: bool = False
    session_id: str | None = None

    @field_validator("messages")
    @classmethod
    def _prompt_or_messages(cls, v, info):
        if (info.data.get("prompt") is None) == (v is None):
            raise ValueError("set either prompt (text) or messages (a conversation), one of them")
        return v


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[TokenId]
