"""`ModelTokenizer.fewest_tokens` refuses long prompts before tokenizing them: it must never exceed the
tokens a text really becomes, or a prompt that fits would be refused."""

import random

import pytest

from rollout_server.tokenizer import ModelTokenizer
from tests.tiny_models import untrained_tiny_model


@pytest.fixture(scope="module")
def tokenizer() -> ModelTokenizer:
    return ModelTokenizer(untrained_tiny_model())


def texts(tokenizer: ModelTokenizer) -> dict[str, str]:
    longest = max(tokenizer.hf.get_vocab(), key=len)
    rng = random.Random(0)
    return {
        "the longest token, repeated": tokenizer.decode(tokenizer.hf.convert_tokens_to_ids([longest]) * 2000,
                                                        skip_special_tokens=False),
        "special tokens written as text": "<|im_start|><|im_end|>" * 2000,
        "characters that NFC composes (e + accent, Hangul jamo)": "e\u0301" * 3000 + "\u1100\u1161\u11a8" * 3000,
        "spaces": " " * 50_000,
        "English": "the quick brown fox jumps over the lazy dog " * 1000,
        "random code points": "".join(chr(rng.randrange(32, 0x3000)) for _ in range(20_000)),
    }


def test_the_bound_never_exceeds_the_real_count(tokenizer):
    for name, text in texts(tokenizer).items():
        assert tokenizer.fewest_tokens(len(text)) <= len(tokenizer.encode(text)), name
