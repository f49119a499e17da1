"""What a repair keeps: the tokens that spell the output up to the failing call, exactly, or none."""

from types import SimpleNamespace

from engine.contract import SampledToken
from rollout_server.serving.call_repair import kept_tokens
from rollout_server.serving.finished import ChoiceResult
from rollout_server.tokenizer import ModelTokenizer
from tests.tiny_models import untrained_tiny_model


def choice_of(tokenizer: ModelTokenizer, text: str) -> ChoiceResult:
    ids = tokenizer.hf.encode(text, add_special_tokens=False)
    return ChoiceResult(0, text=text, tokens=[SampledToken(i, -0.5, []) for i in ids], finish_reason="tool_calls")


def test_the_tokens_before_the_failing_call_are_kept_exactly():
    tokenizer = ModelTokenizer(untrained_tiny_model())
    ctx = SimpleNamespace(tokenizer=tokenizer)
    before = 'Checking both.\n<tool_call>\n{"name": "f", "arguments": {"v": [1, 2]}}\n</tool_call>\n'
    choice = choice_of(tokenizer, before + '<tool_call>\n{"name": "f", "arguments": {"v": [1, 1]}}\n</tool_call>')
    kept = kept_tokens(ctx, choice, len(before))
    assert tokenizer.hf.decode([t.token_id for t in kept]) == before
    assert kept == choice.tokens[:len(kept)]
    assert kept_tokens(ctx, choice, 0) == []


def test_no_token_is_kept_when_none_ends_at_the_call():
    tokenizer = ModelTokenizer(untrained_tiny_model())
    choice = choice_of(tokenizer, "abcdefgh")
    ends = {len(tokenizer.hf.decode([t.token_id for t in choice.tokens[:i]])) for i in range(len(choice.tokens) + 1)}
    inside = next(offset for offset in range(1, len(choice.text)) if offset not in ends)
    assert kept_tokens(SimpleNamespace(tokenizer=tokenizer), choice, inside) == []
