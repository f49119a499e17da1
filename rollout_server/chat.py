"""POST /v1/chat/completions.

The front door renders the chat template itself (exact prompt ids), sends the ids
to the engine, and builds the OpenAI response (or its SSE stream) from the
engine's tokens. Tools are rendered into the prompt by the model's template.
"""

from __future__ import annotations

import json
import time

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.frontend_client import EngineRequest
from rollout_server.errors import APIError, bad_request
from rollout_server.generation import ChoiceResult, Generation, ServingContext, check_prompt, new_request_id, sampling_dict, session_id_for
from rollout_server.logprobs import chat_logprobs
from rollout_server.protocol import ChatCompletionRequest


def _messages(req: ChatCompletionRequest) -> list[dict]:
    messages = []
    for i, m in enumerate(req.messages):
        try:
            text = m.text()
        except ValueError as exc:
            raise bad_request(str(exc), param=f"messages.{i}.content") from exc
        message = {"role": "system" if m.role == "developer" else m.role, "content": text or ""}
        if m.tool_calls:
            message["tool_calls"] = m.tool_calls
        if m.tool_call_id:
            message["tool_call_id"] = m.tool_call_id
        if m.name:
            message["name"] = m.name
        messages.append(message)
    return messages


def guided_decoding(response_format: dict | None, param: str = "response_format") -> dict:
    """response_format -> the engine's structured-output field (Dynamo: guided_json)."""
    if not response_format or response_format.get("type") == "text":
        return {}
    kind = response_format.get("type")
    if kind == "json_object":
        return {"guided_json": {"type": "object"}}
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise bad_request("response_format.json_schema.schema must be a JSON schema object", param=f"{param}.json_schema.schema")
        return {"guided_json": schema}
    raise bad_request(f"response_format type {kind!r} is not supported (text, json_object, json_schema)", param=f"{param}.type")


def build_engine_request(ctx: ServingContext, req: ChatCompletionRequest, session_id: str) -> EngineRequest:
    try:
        prompt_ids = ctx.tokenizer.render_chat(_messages(req), req.tools, req.add_generation_prompt,
                                               req.continue_final_message)
    except APIError:
        raise
    except Exception as exc:  # the template rejected the conversation (e.g. a role it does not know)
        raise bad_request(f"the chat template could not render these messages: {exc}", param="messages") from exc
    max_tokens = check_prompt(ctx, prompt_ids, req.max_new_tokens, "messages")
    return EngineRequest(
        model=ctx.model_name, request_id=new_request_id("chatcmpl"), prompt_token_ids=prompt_ids,
        max_tokens=max_tokens, sampling=sampling_dict(req), top_logprobs=req.top_logprobs or 0,
        guided=guided_decoding(req.response_format), session_id=session_id, prompt_param="messages",
    )


def _choice_json(ctx: ServingContext, req: ChatCompletionRequest, choice: ChoiceResult) -> dict:
    body = {
        "index": choice.index,
        "message": {"role": "assistant", "content": choice.text},
        "finish_reason": choice.finish_reason,
        "logprobs": chat_logprobs(ctx.tokenizer, choice.tokens, req.top_logprobs or 0, req.return_tokens_as_token_ids)
        if req.logprobs else None,
    }
    if req.return_token_ids:
        body["token_ids"] = choice.token_ids
    return body


async def chat_completions(ctx: ServingContext, req: ChatCompletionRequest, request: Request, team: str):
    if req.model != ctx.model_name:
        raise APIError(404, f"The model `{req.model}` does not exist.", param="model", code="model_not_found")
    session_id = session_id_for(request, req.user)
    engine_request = build_engine_request(ctx, req, session_id)
    generation = Generation(ctx, engine_request, team=team, endpoint="chat.completions",
                            request_body=req.model_dump(exclude_none=True))
    await generation.start()
    if req.stream:
        return StreamingResponse(_stream(ctx, req, generation), media_type="text/event-stream",
                                 headers=generation.response_headers())
    choices = await generation.run_to_end()
    body = {
        "id": engine_request.request_id, "object": "chat.completion", "created": int(generation.created_at),
        "model": ctx.model_name, "choices": [_choice_json(ctx, req, c) for c in choices],
        "usage": generation.usage_dict(), "policy_version": ctx.policy_version,
        "session_id": session_id, "worker_id": generation.worker_id,
    }
    if req.return_token_ids:
        body["prompt_token_ids"] = engine_request.prompt_token_ids
    return JSONResponse(body, headers=generation.response_headers())


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _stream(ctx: ServingContext, req: ChatCompletionRequest, generation: Generation):
    base = {"id": generation.req.request_id, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": ctx.model_name, "policy_version": ctx.policy_version}
    started: set[int] = set()
    try:
        async for chunk in generation.chunks():
            for delta in chunk.deltas:
                message = {"content": delta.text}
                if delta.index not in started:
                    started.add(delta.index)
                    message["role"] = "assistant"
                choice = {"index": delta.index, "delta": message, "finish_reason": delta.finish_reason, "logprobs": None}
                if req.logprobs:
                    choice["logprobs"] = chat_logprobs(ctx.tokenizer, delta.tokens, req.top_logprobs or 0,
                                                       req.return_tokens_as_token_ids)
                if req.return_token_ids:
                    choice["token_ids"] = [t.token_id for t in delta.tokens]
                yield sse({**base, "choices": [choice]})
        if req.stream_options and req.stream_options.include_usage:
            yield sse({**base, "choices": [], "usage": generation.usage_dict()})
    except APIError as err:
        yield sse(err.body())
    yield "data: [DONE]\n\n"
