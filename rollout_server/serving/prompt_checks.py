"""A prompt checked against the model before it reaches the engine: every refusal is a 400 naming the field.

The engine would refuse the same prompts, but without naming the client's field; and a text prompt surely
longer than the context window is refused before the work of tokenizing it.
"""

from __future__ import annotations

from rollout_server.errors import bad_request
from rollout_server.serving.context import ServingContext


def check_in_vocabulary(ctx: ServingContext, ids: list[int], param: str) -> None:
    bad = ctx.tokenizer.out_of_vocab(ids)
    if bad is not None:
        raise bad_request(f"Token id {bad} is out of vocabulary (vocabulary size {ctx.tokenizer.vocab_size}).",
                          param=param, code="token_out_of_vocabulary")


def check_prompt_chars(ctx: ServingContext, chars: int, prompt_param: str) -> None:
    """Refuses a text prompt surely over the context window before it is tokenized."""
    at_least = ctx.tokenizer.fewest_tokens(chars)
    if at_least > ctx.max_model_len:
        raise bad_request(f"This model's maximum context length is {ctx.max_model_len} tokens. However, your prompt "
                          f"has at least {at_least} tokens ({chars} characters).", param=prompt_param,
                          code="context_length_exceeded")


def check_prompt(ctx: ServingContext, prompt_ids: list[int], max_tokens: int | None, prompt_param: str,
                 max_tokens_param: str = "max_tokens") -> int:
    """Validates the prompt against the vocabulary and context window; returns the max_tokens to use
    (`max_tokens_param`: the client's field that set it, named in errors)."""
    check_in_vocabulary(ctx, prompt_ids, prompt_param)
    room = ctx.max_model_len - len(prompt_ids)
    if room <= 0:
        raise bad_request(f"This model's maximum context length is {ctx.max_model_len} tokens. However, your prompt "
                          f"has {len(prompt_ids)} tokens.", param=prompt_param, code="context_length_exceeded")
    if max_tokens is None:
        return min(room, ctx.settings.server.default_max_tokens or room)
    if max_tokens > room:
        raise bad_request(f"This model's maximum context length is {ctx.max_model_len} tokens. However, you requested "
                          f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the prompt, {max_tokens} for the "
                          f"completion). Please reduce the length of the prompt or max_tokens.",
                          param=max_tokens_param, code="context_length_exceeded")
    return max_tokens
