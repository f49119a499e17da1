"""Every client mistake is an OpenAI-shaped 4xx naming the field; never a 500, never a hang."""

import httpx
import openai
import pytest

MODEL = "tiny-qwen2"
MSG = [{"role": "user", "content": "x"}]


def post(stack, path, body=None, content=None):
    return httpx.post(f"{stack.url}{path}", json=body, content=content, timeout=60,
                      headers={"content-type": "application/json"})


def assert_error(resp, status, param=None, code=None):
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


def test_malformed_json(stack):
    assert_error(post(stack, "/v1/chat/completions", content=b'{"model": "tiny-qwen2", "messages": ['), 400,
                 code="invalid_json")


@pytest.mark.parametrize("declared", [True, False])
def test_a_body_over_the_size_limit_is_a_413_and_the_server_goes_on(stack, client, declared):
    """Refused before it is read, parsed and tokenized (the default limit is 32 MiB), with or without a
    Content-Length header (chunked)."""
    words = b'"' + b"word " * (7 * 2**20) + b'"'  # 35 MiB
    body = b'{"model": "tiny-qwen2", "messages": [{"role": "user", "content": ' + words + b"}]}"
    content = body if declared else (body[i:i + 2**20] for i in range(0, len(body), 2**20))
    error = assert_error(post(stack, "/v1/chat/completions", content=content), 413)
    assert "max_request_body_mib" in error["message"]
    assert client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=2).choices[0].message is not None


@pytest.mark.parametrize("content", [b"null", b"[]", b"5", b'"hello"'])
def test_a_body_that_is_not_an_object_is_refused(stack, content):
    error = assert_error(post(stack, "/v1/chat/completions", content=content), 400, code="invalid_value")
    assert error["message"].startswith("The request body must be a JSON object")


def test_a_wrong_method_is_a_405_that_says_which_are_allowed(stack):
    resp = httpx.get(f"{stack.url}/v1/chat/completions", timeout=60)
    error = assert_error(resp, 405)
    assert error["type"] == "invalid_request_error" and resp.headers["allow"] == "POST"


def test_unknown_model(stack, client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="no-such-model", messages=MSG)
    assert err.value.body["param"] == "model"
    assert_error(post(stack, "/inference/v1/generate", {"model": "gpt-9", "token_ids": [1]}), 404, param="model")


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"model": MODEL, "messages": MSG, "max_tokens": -5}, "max_tokens"),
    ("/v1/chat/completions", {"model": MODEL, "messages": MSG, "temperature": -1}, "temperature"),
    ("/v1/chat/completions", {"model": MODEL, "messages": MSG, "temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {"model": MODEL, "messages": MSG, "n": 0}, "n"),
    ("/v1/chat/completions", {"model": MODEL, "messages": MSG, "top_p": 1.5}, "top_p"),
    ("/v1/chat/completions", {"model": MODEL, "messages": "hello"}, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ("/v1/chat/completions", {"model": MODEL}, "messages"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 99}, "logprobs"),
    ("/v1/completions", {"model": MODEL, "prompt": []}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": {"100": 100}}, "logit_bias"),
    ("/v1/chat/completions", {"model": MODEL, "messages": MSG, "stop": ""}, "stop"),
    ("/v1/chat/completions", {"model": MODEL, "messages": MSG, "seed": 2**70}, "seed"),
    ("/v1/chat/completions", {"model": MODEL, "messages": MSG, "temperature": 3}, "temperature"),
    # Checked against max_tokens and the vocabulary: the engine would refuse them mid-stream, naming nothing.
    ("/v1/chat/completions", {"model": MODEL, "messages": MSG, "min_tokens": 10, "max_tokens": 3}, "min_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stop_token_ids": [10**6]}, "stop_token_ids"),
    ("/inference/v1/generate", {"model": MODEL, "token_ids": [1], "sampling_params": {"min_tokens": 9, "max_tokens": 2}},
     "sampling_params.min_tokens"),
    ("/inference/v1/generate", {"model": MODEL, "token_ids": [1, -2]}, "token_ids.1"),
    ("/inference/v1/generate", {"model": MODEL, "token_ids": [1], "sampling_params": {"max_tokens": "many"}},
     "sampling_params.max_tokens"),
])
def test_wrong_values_and_types_name_the_field(stack, path, body, param):
    assert_error(post(stack, path, body), 400, param=param)


def test_token_ids_out_of_vocabulary(stack, client):
    assert_error(post(stack, "/inference/v1/generate", {"model": MODEL, "token_ids": [1, 10**6]}), 400,
                 param="token_ids", code="token_out_of_vocabulary")
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=[5, 999999], max_tokens=2)
    assert err.value.body["param"] == "prompt"


def test_prompt_over_the_context_window(stack, client):
    long_prompt = [7] * 40000
    assert_error(post(stack, "/v1/completions", {"model": MODEL, "prompt": long_prompt, "max_tokens": 1}), 400,
                 param="prompt", code="context_length_exceeded")
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 40000}], max_tokens=1)
    assert err.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=32768)
    assert err.value.body["param"] == "max_tokens"


def test_unsupported_content_part_is_named(stack):
    body = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    assert_error(post(stack, "/v1/chat/completions", body), 400, param="messages.0.content")


def test_errors_are_counted_not_fatal(stack, client):
    """After all the bad requests above the stack still serves."""
    reply = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=2)
    assert reply.choices[0].finish_reason in ("length", "stop")
