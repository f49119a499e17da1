"""vLLM's own request fields through the real stack: each one is applied, or refused with a 400 naming it;
none is served as if it had not been sent."""

import itertools
import json
import re

import httpx
import pytest

from rollout_server.tokenizer import ModelTokenizer
from tests.api.test_errors import assert_error, post
from tests.tiny_models import trained_tiny_model

pytestmark = pytest.mark.stack

MODEL = "tiny-qwen2"
MSG = [{"role": "user", "content": "answer"}]


def chat(stack, **fields) -> dict:
    resp = post(stack, "/v1/chat/completions", {"model": MODEL, "messages": MSG, "max_tokens": 16, **fields})
    assert resp.status_code == 200, resp.text
    return resp.json()


def completion(stack, headers=None, **fields) -> httpx.Response:
    resp = httpx.post(f"{stack.url}/v1/completions", json={"model": MODEL, "max_tokens": 16, **fields}, timeout=120,
                      headers=headers or {})
    assert resp.status_code == 200, resp.text
    return resp


@pytest.mark.parametrize("seed", range(3))
def test_structured_outputs_choice_picks_one_of_the_choices(stack, seed):
    reply = chat(stack, temperature=1.0, seed=seed, structured_outputs={"choice": ["alpha", "beta", "gamma"]})
    assert reply["choices"][0]["message"]["content"] in ("alpha", "beta", "gamma")


def test_structured_outputs_regex_and_grammar_shape_the_text(stack):
    digits = completion(stack, prompt="the number is", temperature=1.0, seed=1,
                        structured_outputs={"regex": "[0-9]{3}-[a-z]{2}"}).json()["choices"][0]
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", digits["text"]) and digits["finish_reason"] == "stop", digits
    grammar = 'root ::= "yes" | "no" | "maybe"'
    word = completion(stack, prompt="well", structured_outputs={"grammar": grammar}).json()["choices"][0]
    assert word["text"] in ("yes", "no", "maybe")


def test_structured_outputs_json_on_the_token_route(stack):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    resp = post(stack, "/inference/v1/generate", {"model": MODEL, "token_ids": [5, 6, 7],
                                                  "sampling_params": {"max_tokens": 40, "structured_outputs": {"json": schema}}})
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert set(json.loads(choice["text"])) == {"n"}
    else:  # ran out of tokens inside an integer: still the schema's prefix
        assert re.fullmatch(r'\{\s?"n"\s?:\s?-?[0-9]*', choice["text"]), choice


def test_include_stop_str_in_output_keeps_the_stop_string(stack):
    greedy = completion(stack, prompt="the model says", max_tokens=12, temperature=0).json()["choices"][0]["text"]
    stop_at = greedy[len(greedy) // 2:][:3]
    assert stop_at.strip(), f"need a non-blank stop string from {greedy!r}"
    kept = completion(stack, prompt="the model says", max_tokens=12, temperature=0, stop=[stop_at],
                      include_stop_str_in_output=True).json()["choices"][0]
    assert kept["finish_reason"] == "stop" and kept["text"].endswith(stop_at)
    assert greedy.startswith(kept["text"])


def test_the_session_id_field_names_the_session_and_the_header_wins(stack):
    assert completion(stack, prompt="hi", max_tokens=2, session_id="from-body").headers["x-session-id"] == "from-body"
    both = completion(stack, {"X-Session-ID": "from-header"}, prompt="hi", max_tokens=2, session_id="from-body")
    assert both.headers["x-session-id"] == "from-header"


def test_a_request_stream_interval_sets_the_tokens_per_message(stack):
    body = {"model": MODEL, "prompt": "gather", "max_tokens": 33, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_interval": 8, "return_token_ids": True}
    sizes = []
    with httpx.stream("POST", f"{stack.url}/v1/completions", json=body, timeout=120) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                sizes += [len(c["token_ids"]) for c in json.loads(line[6:])["choices"] if c.get("token_ids")]
    # The worker sends the first token at once, then every 8th; under load vLLM may merge messages its
    # consumer has not read yet, so a message ends at one of those points, never between them.
    ends = list(itertools.accumulate(sizes))
    assert ends[-1] == 33 and set(ends) <= {1, 9, 17, 25, 33}, sizes


def test_a_cache_salt_keeps_cached_prefixes_apart(stack):
    prompt = list(range(100, 420))          # ten 32-token blocks

    def cached(salt: str) -> int:
        reply = completion(stack, {"X-Session-ID": "salted"}, prompt=prompt, max_tokens=1, cache_salt=salt).json()
        return reply["usage"]["prompt_tokens_details"]["cached_tokens"]

    cached("team-a")
    assert cached("team-a") >= 288
    assert cached("team-b") == 0


def test_chat_template_kwargs_and_documents_reach_the_template():
    tokenizer = ModelTokenizer(trained_tiny_model())
    tokenizer.hf.chat_template = "{{ project }}|{{ documents[0].text }}|{{ messages[0].content }}"
    ids = tokenizer.render_chat([{"role": "user", "content": "hi"}], None, documents=[{"text": "doc"}],
                                template_kwargs={"project": "rollout"})
    assert tokenizer.decode(ids) == "rollout|doc|hi"


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"allowed_token_ids": [5]}, "allowed_token_ids"),
    ("/v1/chat/completions", {"bad_words": ["the"]}, "bad_words"),
    ("/v1/chat/completions", {"prompt_logprobs": 1}, "prompt_logprobs"),
    ("/v1/chat/completions", {"use_beam_search": True}, "use_beam_search"),
    ("/v1/chat/completions", {"priority": 3}, "priority"),
    ("/v1/chat/completions", {"chat_template": "{{ messages }}"}, "chat_template"),
    ("/v1/chat/completions", {"echo": True}, "echo"),
    ("/v1/chat/completions", {"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs"),
    ("/v1/chat/completions", {"structured_outputs": {"regex": "[0-9"}}, "structured_outputs.regex"),
    ("/v1/chat/completions", {"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ("/v1/chat/completions", {"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}},
     "structured_outputs"),
    ("/v1/chat/completions", {"structured_outputs": {"choice": ["a"]},
                              "tools": [{"type": "function", "function": {"name": "f"}}]}, "structured_outputs"),
    ("/v1/completions", {"prompt_embeds": "AAAA"}, "prompt_embeds"),
    ("/v1/completions", {"truncate_prompt_tokens": 10}, "truncate_prompt_tokens"),
    ("/inference/v1/generate", {"sampling_params": {"allowed_token_ids": [5]}}, "sampling_params.allowed_token_ids"),
    ("/inference/v1/generate", {"sampling_params": {"structured_outputs": {"json": "{"}}},
     "sampling_params.structured_outputs.json"),
])
def test_a_field_the_server_cannot_apply_is_refused_by_name(stack, path, body, param):
    prompt = {"/v1/chat/completions": {"messages": MSG}, "/v1/completions": {"prompt": "x"},
              "/inference/v1/generate": {"token_ids": [5]}}[path]
    assert_error(post(stack, path, {"model": MODEL, **prompt, **body}), 400, param=param)


@pytest.mark.parametrize("path,prompt", [("/v1/completions", {"prompt": "count", "logprobs": 0}),
                                         ("/v1/chat/completions", {"messages": MSG, "logprobs": True})])
def test_continuous_usage_stats_puts_the_usage_so_far_in_every_chunk(stack, path, prompt):
    body = {"model": MODEL, **prompt, "max_tokens": 6, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.stream("POST", f"{stack.url}{path}", json=body, timeout=120) as resp:
        chunks = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    # A chunk can carry several tokens (the engine merges them when its reader falls behind): each token is
    # counted by its logprob entry.
    streamed = 0
    for chunk in chunks:
        for choice in chunk["choices"]:
            logprobs = choice.get("logprobs") or {}
            streamed += len(logprobs.get("content") or logprobs.get("tokens") or [])
        assert chunk["usage"]["completion_tokens"] == streamed
    assert streamed == 6
