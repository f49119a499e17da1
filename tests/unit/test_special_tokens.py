"""Text prompts get the tokenizer's own special tokens (a BOS) where vLLM adds them: completions and /tokenize
of a prompt by default, chat only when asked (the chat template writes its own)."""

import asyncio
from types import SimpleNamespace

from tokenizers import processors

from rollout_server.auth import Principal
from rollout_server.completions import _prompts_as_ids
from rollout_server.protocol import TokenizeRequest
from rollout_server.settings import Settings
from rollout_server.tokenization import tokenize
from rollout_server.tokenizer import ModelTokenizer
from tests.tiny_models import untrained_tiny_model

MESSAGES = [{"role": "user", "content": "hello"}]
NOBODY = Principal("team", None, is_admin=False)


def tokenizer_with_bos() -> tuple[ModelTokenizer, int]:
    """The tiny model's tokenizer, made to put <|endoftext|> before every text as a Llama-style BOS."""
    tokenizer = ModelTokenizer(untrained_tiny_model())
    bos = tokenizer.hf.convert_tokens_to_ids("<|endoftext|>")
    tokenizer.hf.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)])
    return tokenizer, bos


def context_double(tokenizer: ModelTokenizer) -> SimpleNamespace:
    """Test double for ServingContext: what the tokenizing paths read."""
    return SimpleNamespace(tokenizer=tokenizer, max_model_len=32768, tool_format=None, settings=Settings())


def test_completions_text_prompts_get_the_bos_unless_told_not_to():
    tokenizer, bos = tokenizer_with_bos()
    ctx = context_double(tokenizer)
    text = tokenizer.encode("hello world")
    assert asyncio.run(_prompts_as_ids(ctx, "hello world")) == [[bos] + text]
    assert asyncio.run(_prompts_as_ids(ctx, "hello world", add_special_tokens=False)) == [text]
    assert asyncio.run(_prompts_as_ids(ctx, [5, 6, 7])) == [[5, 6, 7]]  # ids are taken as given


def test_chat_prompts_get_the_bos_only_when_asked():
    tokenizer, bos = tokenizer_with_bos()
    plain = tokenizer.render_chat(MESSAGES, None)
    assert plain[0] != bos
    assert tokenizer.render_chat(MESSAGES, None, add_special_tokens=True) == [bos] + plain


def test_tokenize_adds_the_bos_as_completions_and_chat_do():
    tokenizer, bos = tokenizer_with_bos()
    ctx = context_double(tokenizer)
    prompt = asyncio.run(tokenize(ctx, TokenizeRequest(prompt="hello world"), None, NOBODY))
    assert prompt["tokens"] == asyncio.run(_prompts_as_ids(ctx, "hello world"))[0]
    bare = asyncio.run(tokenize(ctx, TokenizeRequest(prompt="hello world", add_special_tokens=False), None, NOBODY))
    assert bare["tokens"] == prompt["tokens"][1:]
    chat = asyncio.run(tokenize(ctx, TokenizeRequest(messages=MESSAGES), None, NOBODY))
    assert chat["tokens"] == tokenizer.render_chat(MESSAGES, None)
