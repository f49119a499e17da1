"""Sampled tokens -> the logprob shapes of the OpenAI API (chat and completions)."""

from __future__ import annotations

from engine.contract import SampledToken
from rollout_server.tokenizer import ModelTokenizer


def token_label(tokenizer: ModelTokenizer, token_id: int, as_id: bool) -> str:
    return f"token_id:{token_id}" if as_id else tokenizer.token_text(token_id)


def chat_logprobs(tokenizer: ModelTokenizer, tokens: list[SampledToken], top_n: int, as_id: bool) -> dict:
    def entry(token_id: int, logprob: float) -> dict:
        return {"token": token_label(tokenizer, token_id, as_id), "logprob": logprob,
                "bytes": list(tokenizer.token_bytes(token_id))}

    return {"content": [
        {**entry(t.token_id, t.logprob), "top_logprobs": [entry(i, lp) for i, lp in t.top[:top_n]]}
        for t in tokens
    ]}


def completion_logprobs(tokenizer: ModelTokenizer, tokens: list[SampledToken], top_n: int, as_id: bool,
                        text_offset_start: int = 0) -> dict:
    labels = [token_label(tokenizer, t.token_id, as_id) for t in tokens]
    offsets, pos = [], text_offset_start
    for t in tokens:
        offsets.append(pos)
        pos += len(tokenizer.token_text(t.token_id))
    return {
        "tokens": labels,
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [{token_label(tokenizer, i, as_id): lp for i, lp in t.top[:top_n]} for t in tokens],
        "text_offset": offsets,
    }


def generate_logprobs(tokens: list[SampledToken], top_n: int) -> dict:
    """verifiers' train mode reads `token == "token_id:<id>"` and a finite logprob per sampled token."""
    return {"content": [
        {"token": f"token_id:{t.token_id}", "token_id": t.token_id, "logprob": t.logprob,
         "top_logprobs": [{"token": f"token_id:{i}", "token_id": i, "logprob": lp} for i, lp in t.top[:top_n]]}
        for t in tokens
    ]}
