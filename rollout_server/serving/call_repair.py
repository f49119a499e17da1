"""A chat choice whose tool call breaks its schema, sampled again from just before that call.

The grammar enforces most of a tool's JSON Schema while sampling; what it cannot (uniqueItems, oneOf, ...:
rollout_server/tool_calls/schema_keywords.py) is checked on the finished call. The rules of a repair:
- it keeps what came before the failing call (content, earlier calls: their exact tokens) and samples again
  from there, at most `server.tool_call_retries` times per choice;
- a retry is an engine request of its own (its own trace record, usage and metrics): prompt = the original
  prompt + the kept tokens; grammar = the tools' "required" grammar, so it starts with a call (a named
  tool_choice keeps its own); sampling = the request's, seed + attempt and, for a greedy request, temperature
  1.0, since a greedy retry would write the same call again;
- a retry served by another policy version than the choice's is discarded: one answer, one version;
- when every retry fails, the choice ends with finish_reason "error" and the failing call's text as content,
  never as a tool call a client would run.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from engine.contract import EngineRequest, GuidedDecoding, SampledToken
from engine.ids import new_request_id
from rollout_server.auth import Principal
from rollout_server.errors import APIError
from rollout_server.serving.context import ServingContext
from rollout_server.serving.finished import ChoiceResult
from rollout_server.serving.generation import Generation
from rollout_server.tool_calls.argument_check import ArgumentCheck, InvalidCall

log = logging.getLogger(__name__)

MAX_SEED = 2**63 - 1


@dataclass
class CallRepair:
    check: ArgumentCheck
    guided: GuidedDecoding | None   # the grammar a retry samples under

    async def repaired(self, ctx: ServingContext, original: Generation, choice: ChoiceResult, who: Principal,
                       finish_choice) -> tuple[ChoiceResult, list[Generation]]:
        """The choice, its failing call sampled again if it has one; and the retries' generations (for usage).
        `finish_choice` sets a choice's message and finish reason (chat.py)."""
        retries: list[Generation] = []
        for attempt in range(1, ctx.settings.server.tool_call_retries + 1):
            invalid = self._invalid_call(choice)
            if invalid is None:
                return choice, retries
            kept = kept_tokens(ctx, choice, invalid.text_offset)
            budget = original.req.max_tokens - len(kept)
            if budget <= 0:
                break
            log.info("request %s choice %d: call %d (%s) breaks its schema (%s); sampling it again (%d/%d)",
                     original.req.request_id, choice.index, invalid.index, invalid.name, invalid.reason, attempt,
                     ctx.settings.server.tool_call_retries)
            retry = Generation(ctx, self._retry_request(original.as_sent(), kept, budget, attempt), who=who,
                               endpoint=original.endpoint,
                               request_body={**original.request_body, "retry_of": original.request_id},
                               prompt_param=original.prompt_param, on_choice_finished=finish_choice)
            try:
                await retry.start()
                [again] = await retry.run_to_end()
            except APIError as err:  # the answer stands without the repair: the choice gives up below
                log.warning("request %s: a retry failed: %s", original.req.request_id, err.message)
                break
            retries.append(retry)
            if retry.policy_version != original.policy_version:
                log.warning("request %s: a retry ran on policy version %s, the choice on %s; discarded",
                            original.req.request_id, retry.policy_version, original.policy_version)
                continue
            choice = ChoiceResult(choice.index, text=choice.text[:invalid.text_offset] + again.text,
                                  tokens=kept + again.tokens, finish_reason=again.finish_reason)
            finish_choice(choice)
        invalid = self._invalid_call(choice)
        if invalid is not None:
            choice = self._given_up(choice, invalid)
        return choice, retries

    def _invalid_call(self, choice: ChoiceResult) -> InvalidCall | None:
        if choice.finish_reason != "tool_calls":  # cut by max_tokens, or malformed: nothing whole to check
            return None
        return self.check.first_invalid(choice.text, choice.message.get("tool_calls") or [])

    def _given_up(self, choice: ChoiceResult, invalid: InvalidCall) -> ChoiceResult:
        """The choice with its failing call, and what follows it, as content; finish_reason "error"."""
        before = self.check.fmt.parse(choice.text[:invalid.text_offset], self.check.tools)
        message = {"role": "assistant", "content": (before.content or "") + choice.text[invalid.text_offset:]}
        if invalid.index:
            message["tool_calls"] = choice.message["tool_calls"][:invalid.index]
        return dataclasses.replace(choice, message=message, finish_reason="error")

    def _retry_request(self, original: EngineRequest, kept: list[SampledToken], budget: int,
                       attempt: int) -> EngineRequest:
        sampling = original.sampling
        seed = None if sampling.seed is None else (sampling.seed + attempt) % MAX_SEED
        temperature = 1.0 if sampling.temperature == 0 else sampling.temperature
        return dataclasses.replace(
            original, request_id=new_request_id("chatcmpl"), max_tokens=budget, guided=self.guided,
            prompt_token_ids=original.prompt_token_ids + [t.token_id for t in kept],
            sampling=dataclasses.replace(sampling, n=1, seed=seed, temperature=temperature))


def kept_tokens(ctx: ServingContext, choice: ChoiceResult, text_offset: int) -> list[SampledToken]:
    """The choice's tokens that spell its text up to `text_offset`; none when no token ends exactly there."""
    target = len(choice.text[:text_offset].encode())
    spelled = 0
    for i, token in enumerate(choice.tokens):
        if spelled == target:
            return choice.tokens[:i]
        spelled += len(ctx.tokenizer.token_bytes(token.token_id))
        if spelled > target:
            break
    return []
