"""The model's tokenizer, as the front door uses it.

The front door renders chat templates and tokenizes itself, so the token ids it
sends to the engine are exactly the ids it reports (and records) as the prompt.
"""

from __future__ import annotations

import asyncio
from functools import lru_cache
from pathlib import Path
from typing import Callable, TypeVar

from transformers import AutoTokenizer

from rollout_server.session_prompts import session_prompts_for

T = TypeVar("T")

# Tokenizing a long agent prompt on the front door's event loop holds every other stream it serves for that
# long. HF's fast tokenizer releases the GIL while it encodes, so texts longer than this go to a worker
# thread; shorter ones stay inline, where the thread hop would cost more than it saves
# (docs/benchmarks.md, "Measurements behind design choices").
INLINE_TOKENIZE_CHARS = 8_192


async def tokenize_off_the_loop(chars: int, tokenize: Callable[[], T]) -> T:
    """`tokenize()`, which tokenizes `chars` characters: in a worker thread when it is long enough to
    stall the event loop."""
    if chars <= INLINE_TOKENIZE_CHARS:
        return tokenize()
    return await asyncio.to_thread(tokenize)


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: byte-level BPE symbol -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, codes)}


class ModelTokenizer:
    def __init__(self, model_dir: Path, session_prompt_tokens: int = 0):
        """`session_prompt_tokens`: token ids of named sessions' prompts kept so that a returning turn
        tokenizes only what it adds (rollout_server/session_prompts.py); 0 keeps none."""
        self.hf = AutoTokenizer.from_pretrained(str(model_dir))
        self.vocab_size = len(self.hf)
        self.eos_token_id = self.hf.eos_token_id
        self._added = {tok.content for tok in self.hf.added_tokens_decoder.values()}
        self.max_token_chars = max(len(token) for token in self.hf.get_vocab())  # the longest token, in characters
        self.session_prompts = session_prompts_for(self.hf, self.encode, session_prompt_tokens)

    def fewest_tokens(self, chars: int) -> int:
        """At least how many tokens `chars` characters of text become, known without tokenizing them (slow for
        a huge text): a token stands for at most `max_token_chars` characters of normalized text, and Unicode
        normalization (NFC) folds at most 3 characters into one."""
        return chars // (3 * self.max_token_chars)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False)

    def encode_prompt(self, text: str) -> list[int]:
        """A text prompt with the tokenizer's own special tokens (a BOS, for models that have one)."""
        return self.hf.encode(text, add_special_tokens=True)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)

    def render_chat(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool = True,
                    continue_final_message: bool = False, documents: list[dict] | None = None,
                    template_kwargs: dict | None = None, session_id: str | None = None,
                    add_special_tokens: bool = False) -> list[int]:
        """The prompt's token ids; `session_id` names a session whose next turn will extend this prompt.
        `add_special_tokens`: the tokenizer's own (a BOS) on top of those the template writes."""
        text = self.hf.apply_chat_template(
            messages, tools=tools or None, documents=documents, tokenize=False,
            add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message,
            **(template_kwargs or {}),
        )
        if add_special_tokens:
            return self.encode_prompt(text)
        return self.session_prompts.encode(session_id, text)

    def token_bytes(self, token_id: int) -> bytes:
        token = self.hf.convert_ids_to_tokens(token_id)
        if token is None:
            return b""
        if token in self._added:
            return token.encode()
        decoder = _byte_decoder()
        return bytes(decoder[ch] for ch in token if ch in decoder)

    def token_text(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def out_of_vocab(self, ids: list[int]) -> int | None:
        """The first id outside the vocabulary, if any."""
        if not ids or (min(ids) >= 0 and max(ids) < self.vocab_size):  # in C: fast on a long prompt
            return None
        return next(i for i in ids if i < 0 or i >= self.vocab_size)
