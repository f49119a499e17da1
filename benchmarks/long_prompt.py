"""What a long agent prompt costs the front door's event loop: tokenizing it, and parsing a token-id prompt.

    .venv/bin/python benchmarks/long_prompt.py [--tokens 140000] [--rounds 5]

Tokenize: the chat template rendered and tokenized for one user message of ~`--tokens` tokens (the tiny
model's tokenizer), inline on the event loop (as the front door did) and through `tokenize_off_the_loop`
(a worker thread), while a coroutine on the loop measures its longest stall between two turns.
Parse: a /inference/v1/generate body with a `--tokens`-id prompt, decoded by the standard library's json
(FastAPI's default) and by msgspec (`rollout_server/fast_json.py`); validate: the same ids as a
/v1/completions prompt, by the front door's CompletionRequest and by the same union with texts tried first
(as it was: every id then made a validation error); encode: the same ids as the engine
request (`engine/client/dynamo_http.py`) and a /generate response (which echoes them) write them, both ways.
Returning turn: an agent session of ~`--tokens` tokens in 20 turns gets one more turn of ~6,000 tokens;
its prompt rendered and tokenized whole (as before) and from where the turn before ended
(`rollout_server/session_prompts.py`, the session's earlier ids kept); the two give the same ids.
Medians over `--rounds`; ratios are against the old way, same run.
Writes one flat JSON object.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollout_server.harness.stack import CACHE_DIR  # noqa: E402
from rollout_server.protocol import CompletionRequest  # noqa: E402
from rollout_server.tiny_model.builder import ensure_tiny_model  # noqa: E402
from rollout_server.tokenizer import ModelTokenizer, tokenize_off_the_loop  # noqa: E402

SOURCE = (Path(__file__).resolve().parents[1] / "rollout_server" / "serving" / "generation.py").read_text()


class TextsFirstCompletionRequest(CompletionRequest):
    """The baseline: the prompt union as it was, texts before ids."""

    prompt: str | list[str] | list[int] | list[list[int]]


async def longest_stall(work) -> float:
    """The longest time the event loop did not turn while `work` ran, in seconds."""
    stall, done = 0.0, False

    async def watch():
        nonlocal stall
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0)
            now = time.perf_counter()
            stall, last = max(stall, now - last), now

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0)
    await work
    done = True
    await watcher
    return stall


async def _inline(tokenize):
    return tokenize()


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def agent_session(text: str, turns: int) -> list[dict]:
    """`text` cut into `turns` user/assistant turns."""
    step = len(text) // (2 * turns)
    return [{"role": ("user", "assistant")[i % 2], "content": text[i * step:(i + 1) * step]} for i in range(2 * turns)]


def returning_turn_times(tokenizer: ModelTokenizer, text: str, rounds: int) -> tuple[list[float], list[float]]:
    """Seconds to render and tokenize a returning turn's prompt whole, and from the session's last turn."""
    history = agent_session(text, turns=20)
    added = [{"role": "user", "content": text[:len(text) // 23]}]  # ~6,000 tokens, 4% of the session
    whole, session = [], []
    for round_ in range(rounds):
        tokenizer.render_chat(history, None, session_id=f"bench-{round_}")  # the turn before, kept
        whole.append(timed(lambda: tokenizer.render_chat(history + added, None)))
        session.append(timed(lambda: tokenizer.render_chat(history + added, None, session_id=f"bench-{round_}")))
    assert tokenizer.render_chat(history + added, None, session_id="bench-0") == \
        tokenizer.render_chat(history + added, None), "a returning turn must tokenize to the whole prompt's ids"
    return whole, session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=140_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "long_prompt.json")
    args = parser.parse_args()

    tokenizer = ModelTokenizer(ensure_tiny_model(0, CACHE_DIR / "models"), session_prompt_tokens=10_000_000)
    text = SOURCE * (args.tokens // len(tokenizer.encode(SOURCE)) + 1)
    messages = [{"role": "user", "content": text}]
    render = lambda: tokenizer.render_chat(messages, None)  # noqa: E731
    prompt_tokens = len(render())

    inline, threaded = [], []
    for _ in range(args.rounds):
        inline.append(asyncio.run(longest_stall(_inline(render))))
        threaded.append(asyncio.run(longest_stall(tokenize_off_the_loop(len(text), render))))

    returning_whole, returning_session = returning_turn_times(tokenizer, text, args.rounds)

    ids = [random.randrange(tokenizer.vocab_size) for _ in range(args.tokens)]
    body = json.dumps({"model": "m", "token_ids": ids, "sampling_params": {"max_tokens": 16}}).encode()
    engine_body = {"model": "m", "prompt": ids, "max_tokens": 16, "stream": True}
    parse_json = [timed(lambda: json.loads(body)) for _ in range(args.rounds)]
    parse_msgspec = [timed(lambda: msgspec.json.decode(body)) for _ in range(args.rounds)]
    validate_texts_first = [timed(lambda: TextsFirstCompletionRequest(model="m", prompt=ids)) for _ in range(args.rounds)]
    validate = [timed(lambda: CompletionRequest(model="m", prompt=ids)) for _ in range(args.rounds)]
    encode_json = [timed(lambda: json.dumps(engine_body)) for _ in range(args.rounds)]
    encode_msgspec = [timed(lambda: msgspec.json.encode(engine_body)) for _ in range(args.rounds)]

    med = statistics.median
    results = {
        "prompt_tokens": prompt_tokens,
        "prompt_chars": len(text),
        "loop_stall_s_inline": round(med(inline), 4),
        "loop_stall_s_off_the_loop": round(med(threaded), 4),
        "loop_stall_ratio_off_over_inline": round(med(threaded) / med(inline), 4),
        "returning_turn_tokenize_s_whole": round(med(returning_whole), 4),
        "returning_turn_tokenize_s_session": round(med(returning_session), 4),
        "returning_turn_tokenize_ratio_session_over_whole": round(med(returning_session) / med(returning_whole), 4),
        "token_id_prompt_parse_s_json": round(med(parse_json), 5),
        "token_id_prompt_parse_s_msgspec": round(med(parse_msgspec), 5),
        "token_id_prompt_parse_ratio_msgspec_over_json": round(med(parse_msgspec) / med(parse_json), 4),
        "completion_id_prompt_validate_s_texts_first": round(med(validate_texts_first), 5),
        "completion_id_prompt_validate_s": round(med(validate), 5),
        "completion_id_prompt_validate_ratio": round(med(validate) / med(validate_texts_first), 4),
        "engine_request_encode_s_json": round(med(encode_json), 5),
        "engine_request_encode_s_msgspec": round(med(encode_msgspec), 5),
        "engine_request_encode_ratio_msgspec_over_json": round(med(encode_msgspec) / med(encode_json), 4),
    }
    for key, value in results.items():
        print(f"{key:50s} {value}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
