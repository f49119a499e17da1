"""Request bodies of the OpenAI-compatible API, validated.

Pydantic's lax mode coerces "true" -> True and "0.7" -> 0.7, as vLLM does: verifiers
sends sampling keys from its command line as strings. Unknown fields are ignored
(vLLM's behaviour), wrong types and out-of-range values are a 400 naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, field_validator, model_validator


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class SamplingFields(_Request):
    """Sampling knobs shared by every generation endpoint."""

    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    n: int = Field(1, ge=1, le=64)
    seed: int | None = Field(None, ge=-2**63, le=2**63 - 1)
    stop: str | list[str] | None = None
    stop_token_ids: list[NonNegativeInt] | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    min_tokens: NonNegativeInt | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None  # refused when set (below), never passed on

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias_unsupported(cls, v):
        # Dynamo's frontend validates logit_bias but does not hand it to vLLM: refused, not silently dropped.
        if v:
            raise ValueError("logit_bias is not supported by this server (its engine path does not apply it)")
        return v

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v):
        if isinstance(v, str):
            v = [v]
        if v is not None and len(v) > 16:
            raise ValueError("at most 16 stop sequences")
        if v is not None and "" in v:
            raise ValueError("a stop sequence must not be empty")
        return v


class StreamOptions(_Request):
    include_usage: bool = False


class ChatMessage(_Request):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
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


class ChatCompletionRequest(SamplingFields):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    return_tokens_as_token_ids: bool = False
    return_token_ids: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @model_validator(mode="after")
    def _check(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        return self


class CompletionRequest(SamplingFields):
    model: str
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: str | None = None
    return_tokens_as_token_ids: bool = False
    return_token_ids: bool = False
    response_format: dict[str, Any] | None = None

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v):
        if isinstance(v, list) and (len(v) == 0 or any(isinstance(p, list) and not p for p in v)):
            raise ValueError("prompt must not be empty")
        return v


class GenerateSamplingParams(SamplingFields):
    """vLLM SamplingParams, as verifiers' train mode sends them."""

    max_tokens: int | None = Field(None, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)


class GenerateRequest(_Request):
    """POST /inference/v1/generate: token ids in, token ids and logprobs out."""

    model: str
    token_ids: list[NonNegativeInt] = Field(min_length=1)
    sampling_params: GenerateSamplingParams = Field(default_factory=GenerateSamplingParams)
    request_id: str | None = None
    stream: bool = False
