"""POST /v1/completions: text or token-id prompts, one or several."""

from __future__ import annotations

import time
from typing import AsyncIterator

from engine.contract import EngineChunk, EngineRequest
from engine.ids import new_request_id
from engine.sessions import session_id_for
from rollout_server.auth import Principal
from rollout_server.errors import bad_request
from rollout_server.event_stream import EventStreamResponse
from rollout_server.fast_json import MsgspecJSONResponse
from rollout_server.logprobs import completion_logprobs
from rollout_server.protocol import CompletionRequest
from rollout_server.request_limits import check_prompt_count, check_session_ids
from rollout_server.serving.context import ServingContext
from rollout_server.serving.finished import ChoiceResult, policy_versions
from rollout_server.serving.generation import Generation, gather_generations, start_all
from rollout_server.serving.prompt_checks import check_prompt, check_prompt_chars
from rollout_server.serving.sampling import sampling_for, stream_interval_for
from rollout_server.serving.streamed_answer import running_usage_of, sse, streamed_answer
from rollout_server.structured import guided_for
from rollout_server.tokenizer import tokenize_off_the_loop


def _each_prompt(prompt) -> list:
    """A completions prompt in any of its four shapes -> its prompts, each a text or a list of token ids."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):  # the union validated a uniform list
        return [prompt]
    return prompt


async def _prompts_as_ids(ctx: ServingContext, prompt, add_special_tokens: bool = True) -> list[list[int]]:
    """A completions prompt in any of its four shapes -> one list of token ids per prompt. Text prompts get
    the tokenizer's special tokens (a BOS) unless `add_special_tokens` is off; id prompts are taken as given."""
    prompt = _each_prompt(prompt)
    if isinstance(prompt[0], int):
        return [list(prompt)]
    for text in prompt:
        if isinstance(text, str):
            check_prompt_chars(ctx, len(text), "prompt")
    chars = sum(len(p) for p in prompt if isinstance(p, str))
    encode = ctx.tokenizer.encode_prompt if add_special_tokens else ctx.tokenizer.encode
    return await tokenize_off_the_loop(chars, lambda: [encode(p) if isinstance(p, str) else list(p) for p in prompt])


async def completions(ctx: ServingContext, req: CompletionRequest, session_header: str | None, who: Principal):
    ctx.target(req.model, who)
    if req.suffix is not None:
        raise bad_request("suffix is not supported by this model", param="suffix")
    if req.echo and req.logprobs is not None:
        raise bad_request("echo together with logprobs needs prompt logprobs, which the engine does not return; "
                          "request them separately", param="echo")
    check_session_ids(ctx.settings.limits, x_session_id=session_header, session_id=req.session_id, user=req.user)
    check_prompt_count(ctx.settings.limits, len(_each_prompt(req.prompt)))
    prompts = await _prompts_as_ids(ctx, req.prompt, req.add_special_tokens)
    if req.stream and len(prompts) > 1:
        raise bad_request("streaming is supported for a single prompt only", param="prompt")
    session_id = session_id_for(session_header, req.session_id, req.user)
    guided = await guided_for(ctx.grammars, req.response_format, req.structured_outputs)
    request_id = new_request_id("cmpl")
    # Each prompt's generation keeps the request's fields with its own prompt only: memory in proportion to the
    # prompts, not to prompts x request (the whole request once per prompt held 275 MiB for 2,000 short ones).
    shared_fields = req.model_dump(exclude_none=True, exclude={"prompt"})
    generations = []
    for i, (ids, prompt) in enumerate(zip(prompts, _each_prompt(req.prompt))):
        if not ids:
            raise bad_request("prompt must not be empty", param="prompt")
        max_tokens = check_prompt(ctx, ids, req.max_tokens, "prompt")
        engine_request = EngineRequest(
            model=req.model, request_id=request_id if len(prompts) == 1 else f"{request_id}-{i}",
            prompt_token_ids=ids, max_tokens=max_tokens, sampling=sampling_for(ctx, req, max_tokens), top_logprobs=req.logprobs or 0,
            logprobs=req.logprobs is not None or ctx.settings.traces.keeps_logprobs,
            guided=guided, session_id=session_id, cache_salt=req.cache_salt, max_policy_lag=req.max_policy_lag,
            min_policy_version=req.min_policy_version,
            stream_interval=stream_interval_for(ctx, req.stream, req.stream_interval))
        generations.append(Generation(ctx, engine_request, who=who, endpoint="completions",
                                      request_body={**shared_fields, "prompt": prompt}))
    await start_all(generations)
    first = generations[0]
    if req.stream:
        return EventStreamResponse(_stream(ctx, req, first), headers=first.response_headers())
    per_prompt = await gather_generations(generations)
    choices = []
    for p, (g, results) in enumerate(zip(generations, per_prompt)):
        for c in results:
            choices.append(_choice_json(ctx, req, g, c, index=p * req.n + c.index))
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "prompt_tokens_details": {"cached_tokens": 0}}
    for g in generations:
        u = g.usage_dict()
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            usage[key] += u[key]
        usage["prompt_tokens_details"]["cached_tokens"] += u["prompt_tokens_details"]["cached_tokens"]
    body = {"id": request_id, "object": "text_completion", "created": int(first.created_at), "model": req.model,
            "choices": choices, "usage": usage, "policy_version": first.policy_version,
            "session_id": session_id, "worker_id": first.worker_text}
    return MsgspecJSONResponse(body, headers=first.response_headers())


def _choice_json(ctx: ServingContext, req: CompletionRequest, g: Generation, c: ChoiceResult, index: int) -> dict:
    prefix = ctx.tokenizer.decode(g.req.prompt_token_ids) if req.echo else ""
    body = {"index": index, "text": prefix + c.text, "finish_reason": c.finish_reason, "logprobs": None,
            "policy_versions": policy_versions(c.tokens)}
    if req.logprobs is not None:
        body["logprobs"] = completion_logprobs(ctx.tokenizer, c.tokens, req.logprobs, req.return_tokens_as_token_ids)
    if req.return_token_ids:
        body["prompt_token_ids"] = g.req.prompt_token_ids
        body["token_ids"] = c.token_ids
    return body


def _stream(ctx: ServingContext, req: CompletionRequest, generation: Generation) -> AsyncIterator[bytes]:
    base = {"id": generation.request_id, "object": "text_completion", "created": int(time.time()),
            "model": req.model, "policy_version": generation.policy_version}
    echoed: set[int] = set()
    running_usage = req.stream_options is not None and req.stream_options.usage_in_every_chunk()

    def events_of(chunk: EngineChunk) -> list[bytes]:
        events = []
        for delta in chunk.deltas:
            text = delta.text
            if req.echo and delta.index not in echoed:
                echoed.add(delta.index)
                text = ctx.tokenizer.decode(generation.req.prompt_token_ids) + text
            choice = {"index": delta.index, "text": text, "finish_reason": delta.finish_reason, "logprobs": None}
            if delta.tokens:
                choice["policy_versions"] = policy_versions(delta.tokens, generation.first_index(delta))
            if req.logprobs is not None:
                choice["logprobs"] = completion_logprobs(ctx.tokenizer, delta.tokens, req.logprobs,
                                                         req.return_tokens_as_token_ids)
            if req.return_token_ids:
                choice["token_ids"] = [t.token_id for t in delta.tokens]
            events.append(sse({**base, "choices": [choice], **running_usage_of(generation, running_usage)}))
        return events

    return streamed_answer(generation, base, req.stream_options, events_of)
