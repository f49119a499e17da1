"""POST /v1/chat/completions.

The front door renders the chat template itself (exact prompt ids), sends the ids
to the engine, and builds the OpenAI response (or its SSE stream) from the
engine's tokens. With tools, the request's tools and tool_choice become a grammar
the engine enforces, and the output is parsed back into `tool_calls`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

from engine.contract import ChoiceDelta, EngineChunk, EngineRequest, GuidedDecoding, SampledToken
from engine.ids import new_request_id
from engine.sessions import session_id_for
from rollout_server.auth import Principal
from rollout_server.errors import APIError, bad_request
from rollout_server.event_stream import EventStreamResponse
from rollout_server.fast_json import MsgspecJSONResponse
from rollout_server.logprobs import chat_logprobs
from rollout_server.protocol import ChatCompletionRequest, TokenizeRequest
from rollout_server.request_limits import check_session_ids, check_tools
from rollout_server.serving.call_repair import CallRepair
from rollout_server.serving.context import ServingContext
from rollout_server.serving.finished import ChoiceResult, policy_versions
from rollout_server.serving.generation import Generation
from rollout_server.serving.prompt_checks import check_prompt, check_prompt_chars
from rollout_server.serving.sampling import sampling_for, stream_interval_for
from rollout_server.serving.streamed_answer import running_usage_of, sse, stream_end, streamed_answer
from rollout_server.session_prompts import team_session
from rollout_server.structured import guided_for
from rollout_server.tokenizer import tokenize_off_the_loop
from rollout_server.tool_calls import StreamParser, ToolCallFormat, ToolRequestError, finish_reason_for, fold_deltas
from rollout_server.tool_calls.argument_check import ArgumentCheck


@dataclass
class ToolPlan:
    """How this request's tool calls are constrained (structural tag), read back (parser) and, where the grammar
    cannot enforce every keyword of their schemas, checked and repaired (CallRepair)."""

    fmt: ToolCallFormat
    tools: list[dict]
    guided: GuidedDecoding | None
    repair: CallRepair | None = None

    def message_for(self, choice: ChoiceResult) -> tuple[dict, str | None]:
        parsed = self.fmt.parse(choice.text, self.tools)
        message = {"role": "assistant", "content": parsed.content}
        if parsed.tool_calls:
            message["tool_calls"] = parsed.tool_calls
        return message, finish_reason_for(parsed, choice.finish_reason)


def _arguments_as_objects(tool_calls: list[dict]) -> list[dict]:
    calls = []
    for call in tool_calls:
        function = dict(call.get("function") or {})
        if isinstance(function.get("arguments"), str):
            try:
                function["arguments"] = json.loads(function["arguments"] or "{}")
            except ValueError:
                raise bad_request("tool call arguments in the history must be JSON", param="messages") from None
        calls.append({**call, "function": function})
    return calls


def _messages(ctx: ServingContext, req: ChatCompletionRequest | TokenizeRequest) -> list[dict]:
    objects = ctx.tool_format is not None and ctx.tool_format.template_wants_argument_objects
    messages = []
    for i, m in enumerate(req.messages):
        try:
            text = m.text()
        except ValueError as exc:
            raise bad_request(str(exc), param=f"messages.{i}.content") from exc
        message = {"role": "system" if m.role == "developer" else m.role, "content": text or ""}
        if m.tool_calls:
            message["tool_calls"] = _arguments_as_objects(m.tool_calls) if objects else m.tool_calls
        if m.tool_call_id:
            message["tool_call_id"] = m.tool_call_id
        if m.name:
            message["name"] = m.name
        messages.append(message)
    return messages


async def plan_tools(ctx: ServingContext, req: ChatCompletionRequest) -> ToolPlan | None:
    choice = req.tool_choice if req.tool_choice is not None else "auto"
    if not req.tools:
        if choice not in ("none", "auto"):
            raise bad_request("tool_choice needs tools: this request declares none", param="tool_choice")
        return None
    if choice != "none":
        if ctx.tool_format is None:
            raise bad_request(f"model {ctx.model_name} has no tool-call format in its chat template", param="tools")
        if req.response_format and req.response_format.get("type") != "text":
            raise bad_request("response_format cannot be combined with tools", param="response_format")
        if req.structured_outputs is not None:
            raise bad_request("structured_outputs cannot be combined with tools", param="structured_outputs")
    fragment = await checked_tools(ctx, req.tools, choice, req.parallel_tool_calls)
    if choice == "none":
        return None  # tools stay in the prompt; nothing is enforced or parsed
    guided = await _guided(ctx, fragment)
    check = ArgumentCheck(ctx.tool_format, req.tools)
    repair = None
    if check.needed:
        # A retry starts with the call it replaces: the "required" grammar (a named choice keeps its own), with
        # string lengths enforced.
        retry_choice = choice if isinstance(choice, dict) else "required"
        retry_fragment = await checked_tools(ctx, req.tools, retry_choice, req.parallel_tool_calls,
                                             ctx.tool_format.with_string_lengths())
        repair = CallRepair(check, await _guided(ctx, retry_fragment))
    return ToolPlan(ctx.tool_format, req.tools, guided, repair)


async def _guided(ctx: ServingContext, fragment: dict) -> GuidedDecoding | None:
    tag = fragment.get("structured_outputs", {}).get("structural_tag")
    return GuidedDecoding("grammar", await ctx.grammars.off_the_loop(ctx.grammars.ebnf_of, tag)) if tag else None


async def checked_tools(ctx: ServingContext, tools: list[dict], choice: Any = "auto",
                        parallel: bool | None = None, fmt: ToolCallFormat | None = None) -> dict:
    """The engine's grammar fragment for these tools (empty when nothing is enforced), or a 400 naming the
    field. Tools are checked the same way whatever the tool_choice, and by /tokenize, so that ids are never
    rendered for tools a chat request would be refused; once per tool set (GrammarCache), within the request
    limits on tools (rollout_server/request_limits.py) before any of that work."""
    check_tools(ctx.settings.limits, tools)
    try:
        return await ctx.grammars.get(tools, choice, parallel, fmt or ctx.tool_format)
    except ToolRequestError as exc:
        raise bad_request(str(exc), param=exc.param) from exc


async def prompt_ids_for(ctx: ServingContext, req: ChatCompletionRequest | TokenizeRequest,
                         named_session: str | None, add_special_tokens: bool = False,
                         within_context: bool = False) -> list[int]:
    """The conversation's prompt ids, rendered with the model's chat template. `named_session`: a session the
    client named (`team_session`), whose next turn is likely to extend this prompt. `within_context`: a
    conversation surely over the context window is refused before it is rendered (/tokenize counts any)."""
    messages = _messages(ctx, req)
    chars = sum(len(m["content"]) for m in messages) + sum(len(str(d)) for d in req.documents or ())
    if within_context:
        check_prompt_chars(ctx, chars, "messages")
    try:
        return await tokenize_off_the_loop(chars, lambda: ctx.tokenizer.render_chat(
            messages, req.tools, req.add_generation_prompt, req.continue_final_message, req.documents,
            req.chat_template_kwargs, named_session, add_special_tokens))
    except APIError:
        raise
    except Exception as exc:  # the template rejected the conversation (e.g. a role it does not know)
        raise bad_request(f"the chat template could not render these messages: {exc}", param="messages") from exc


async def build_engine_request(ctx: ServingContext, req: ChatCompletionRequest, session_id: str,
                               tool_plan: ToolPlan | None, named_session: str | None = None) -> EngineRequest:
    prompt_ids = await prompt_ids_for(ctx, req, named_session, req.add_special_tokens, within_context=True)
    max_tokens = check_prompt(ctx, prompt_ids, req.max_new_tokens, "messages",
                              "max_completion_tokens" if req.max_completion_tokens else "max_tokens")
    guided = tool_plan.guided if tool_plan else await guided_for(ctx.grammars, req.response_format,
                                                                 req.structured_outputs)
    return EngineRequest(
        model=req.model, request_id=new_request_id("chatcmpl"), prompt_token_ids=prompt_ids,
        max_tokens=max_tokens, sampling=sampling_for(ctx, req, max_tokens), top_logprobs=req.top_logprobs or 0,
        logprobs=req.logprobs or ctx.settings.traces.keeps_logprobs,
        guided=guided, session_id=session_id, cache_salt=req.cache_salt, max_policy_lag=req.max_policy_lag,
            min_policy_version=req.min_policy_version,
        stream_interval=stream_interval_for(ctx, req.stream, req.stream_interval),
    )


def _finish_choice(tool_plan: ToolPlan | None):
    """Sets each finished choice's message (and, with tools, its finish reason) for the response and traces."""
    def finish(choice: ChoiceResult) -> None:
        if tool_plan is None:
            choice.message = {"role": "assistant", "content": choice.text}
        else:
            choice.message, choice.finish_reason = tool_plan.message_for(choice)
    return finish


async def chat_completions(ctx: ServingContext, req: ChatCompletionRequest, session_header: str | None, who: Principal):
    ctx.target(req.model, who)
    check_session_ids(ctx.settings.limits, x_session_id=session_header, session_id=req.session_id, user=req.user)
    session_id = session_id_for(session_header, req.session_id, req.user)
    tool_plan = await plan_tools(ctx, req)
    named_session = team_session(who.team, session_header or req.session_id or req.user)
    engine_request = await build_engine_request(ctx, req, session_id, tool_plan, named_session)
    repair = tool_plan.repair if tool_plan else None
    # A stream whose calls are checked when finished (CallRepair) is answered when they are: in one piece.
    streamed_as_sampled = req.stream and repair is None
    finish_choice = _finish_choice(tool_plan)
    generation = Generation(ctx, engine_request, who=who, endpoint="chat.completions",
                            request_body=req.model_dump(exclude_none=True), prompt_param="messages",
                            on_choice_finished=None if streamed_as_sampled else finish_choice)
    await generation.start()
    if streamed_as_sampled:
        return EventStreamResponse(_stream(ctx, req, generation, tool_plan), headers=generation.response_headers())
    choices = await generation.run_to_end()
    usage = generation.usage_dict()
    if repair is not None:
        repaired = [await repair.repaired(ctx, generation, choice, who, finish_choice) for choice in choices]
        choices = [choice for choice, _ in repaired]
        usage = _with_retries(usage, [retry for _, retries in repaired for retry in retries])
    if req.stream:
        return EventStreamResponse(_whole_stream(ctx, req, generation, choices, usage),
                                   headers=generation.response_headers())
    body = {
        "id": generation.request_id, "object": "chat.completion", "created": int(generation.created_at),
        "model": req.model, "choices": [_choice_json(ctx, req, c) for c in choices],
        "usage": usage, "policy_version": generation.policy_version,
        "session_id": session_id, "worker_id": generation.worker_text,
    }
    if req.return_token_ids:
        body["prompt_token_ids"] = engine_request.prompt_token_ids
    return MsgspecJSONResponse(body, headers=generation.response_headers())


def _with_retries(usage: dict, retries: list[Generation]) -> dict:
    """The answer's usage: its own, plus the tokens its repairs sampled (their prompts were the answer's)."""
    extra = sum(retry.usage_dict()["completion_tokens"] for retry in retries)
    return {**usage, "completion_tokens": usage["completion_tokens"] + extra,
            "total_tokens": usage["total_tokens"] + extra}


def _choice_json(ctx: ServingContext, req: ChatCompletionRequest, choice: ChoiceResult) -> dict:
    body = {
        "index": choice.index, "message": choice.message, "finish_reason": choice.finish_reason,
        "logprobs": chat_logprobs(ctx.tokenizer, choice.tokens, req.top_logprobs or 0, req.return_tokens_as_token_ids)
        if req.logprobs else None, "policy_versions": policy_versions(choice.tokens),
    }
    if req.return_token_ids:
        body["token_ids"] = choice.token_ids
    return body


class _ChoiceStream:
    """One choice's SSE deltas: text through the tool-call parser (if any), tokens as logprobs."""

    def __init__(self, index: int, tool_plan: ToolPlan | None):
        self.index = index
        self.parser: StreamParser | None = tool_plan.fmt.stream_parser(tool_plan.tools) if tool_plan else None
        self.sent: list[dict] = []
        self.started = False

    def deltas(self, delta: ChoiceDelta) -> tuple[list[dict], str | None]:
        deltas = self.parser.feed(delta.text) if self.parser else ([{"content": delta.text}] if delta.text else [])
        finish = delta.finish_reason
        if finish and self.parser:
            tail, finish = self.parser.finish(finish)
            deltas += tail
        if not self.started:
            self.started = True
            deltas = [{"role": "assistant", **(deltas[0] if deltas else {"content": ""})}] + deltas[1:]
        self.sent += deltas
        return deltas, finish

    def message(self) -> dict:
        content, calls = fold_deltas(self.sent)
        message = {"role": "assistant", "content": content if self.parser else (content or "")}
        if calls:
            message["tool_calls"] = calls
        return message


def _stream(ctx: ServingContext, req: ChatCompletionRequest, generation: Generation,
            tool_plan: ToolPlan | None) -> AsyncIterator[bytes]:
    base = {"id": generation.request_id, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": req.model, "policy_version": generation.policy_version}
    streams: dict[int, _ChoiceStream] = {}
    running_usage = req.stream_options is not None and req.stream_options.usage_in_every_chunk()

    def events_of(chunk: EngineChunk) -> list[bytes]:
        events = []
        for delta in chunk.deltas:
            stream = streams.setdefault(delta.index, _ChoiceStream(delta.index, tool_plan))
            for choice in _chunk_choices(ctx, req, stream, delta, generation.first_index(delta)):
                events.append(sse({**base, "choices": [choice], **running_usage_of(generation, running_usage)}))
            if delta.finish_reason:
                result = generation.choices[delta.index]
                result.message, result.finish_reason = stream.message(), choice["finish_reason"]
        return events

    return streamed_answer(generation, base, req.stream_options, events_of)


def _chunk_choices(ctx: ServingContext, req: ChatCompletionRequest, stream: _ChoiceStream, delta: ChoiceDelta,
                   first_index: int) -> list[dict]:
    """The chunk choices for one engine delta, whose first token is the choice's `first_index`-th."""
    deltas, finish = stream.deltas(delta)
    return _as_chunk_choices(ctx, req, delta.index, deltas, finish, delta.tokens, first_index)


def _as_chunk_choices(ctx: ServingContext, req: ChatCompletionRequest, index: int, deltas: list[dict],
                      finish: str | None, tokens: list[SampledToken], first_index: int = 0) -> list[dict]:
    """Chunk choices for these deltas; the tokens, their logprobs and versions ride on the first of them."""
    choices = [{"index": index, "delta": d, "finish_reason": None, "logprobs": None} for d in deltas or [{}]]
    choices[-1]["finish_reason"] = finish
    if tokens:
        choices[0]["policy_versions"] = policy_versions(tokens, first_index)
    if req.logprobs:
        choices[0]["logprobs"] = chat_logprobs(ctx.tokenizer, tokens, req.top_logprobs or 0,
                                               req.return_tokens_as_token_ids)
    if req.return_token_ids:
        choices[0]["token_ids"] = [t.token_id for t in tokens]
    return choices


async def _whole_stream(ctx: ServingContext, req: ChatCompletionRequest, generation: Generation,
                        choices: list[ChoiceResult], usage: dict) -> AsyncIterator[bytes]:
    """Finished choices as a stream: per choice, its content and each whole call, in one write."""
    base = {"id": generation.request_id, "object": "chat.completion.chunk", "created": int(generation.created_at),
            "model": req.model, "policy_version": generation.policy_version}
    events = []
    for choice in choices:
        message = choice.message
        deltas = [{"role": "assistant", "content": message.get("content") or ""}]
        deltas += [{"tool_calls": [{"index": i, **call}]} for i, call in enumerate(message.get("tool_calls") or [])]
        for chunk_choice in _as_chunk_choices(ctx, req, choice.index, deltas, choice.finish_reason, choice.tokens):
            events.append(sse({**base, "choices": [chunk_choice]}))
    yield b"".join(events) + stream_end(base, req.stream_options, usage)
