"""Long prompts are tokenized beside the front door's event loop, not on it."""

import asyncio

from rollout_server.tokenizer import INLINE_TOKENIZE_CHARS, ModelTokenizer, tokenize_off_the_loop
from tests.tiny_models import untrained_tiny_model

# ~600k characters: about 0.3 s of tokenizing; inline, the event loop would not turn once meanwhile.
LONG_TEXT = "def double(x):\n    return x * 2  # an agent's file, read again\n" * 10_000


async def _loop_turns_during(work) -> tuple[object, int]:
    """`work`'s result, and how many times the event loop turned while it ran."""
    turns, done = 0, False

    async def count_turns():
        nonlocal turns
        while not done:
            await asyncio.sleep(0)
            turns += 1

    counter = asyncio.create_task(count_turns())
    await asyncio.sleep(0)
    turns = 0
    result = await work
    turns_during, done = turns, True
    await counter
    return result, turns_during


def test_a_long_prompt_leaves_the_event_loop_free_and_tokenizes_the_same():
    tokenizer = ModelTokenizer(untrained_tiny_model())
    messages = [{"role": "user", "content": LONG_TEXT}]
    assert len(LONG_TEXT) > INLINE_TOKENIZE_CHARS
    ids, turns = asyncio.run(_loop_turns_during(
        tokenize_off_the_loop(len(LONG_TEXT), lambda: tokenizer.render_chat(messages, None))))
    assert ids == tokenizer.render_chat(messages, None)
    assert len(ids) > 100_000
    assert turns > 10, f"the event loop turned {turns} times while {len(ids)} tokens were made"


def test_a_short_prompt_is_tokenized_inline():
    tokenizer = ModelTokenizer(untrained_tiny_model())
    ids, turns = asyncio.run(_loop_turns_during(tokenize_off_the_loop(5, lambda: tokenizer.encode("hello"))))
    assert ids == tokenizer.encode("hello") and turns == 0
