"""Every client mistake is an OpenAI-shaped 4xx naming the field; never a 500, never a hang."""

import json
import socket
import time
from urllib.parse import unquote, urlsplit

import httpx
import openai
import pytest

pytestmark = pytest.mark.stack

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


@pytest.mark.parametrize("content", [b'{"model": "tiny-qwen2", "messages": [',
                                     b'{"model": "tiny-qwen2", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"])
def test_malformed_json(stack, content):
    assert_error(post(stack, "/v1/chat/completions", content=content), 400, code="invalid_json")


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
    ("/inference/v1/generate", {"model": MODEL, "token_ids": [1], "request_id": "r" * 257}, "request_id"),
    ("/v1/chat/completions", {"model": MODEL, "messages": MSG, "top_logprobs": 3}, "top_logprobs"),
    ("/v1/chat/completions", {"model": MODEL, "messages": MSG, "continue_final_message": True},
     "continue_final_message"),
    ("/v1/chat/completions", {"model": MODEL, "messages": MSG, "repetition_penalty": "inf"}, "repetition_penalty"),
    ("/v1/chat/completions", {"model": MODEL, "messages": MSG, "stream": True, "stream_interval": 10**30},
     "stream_interval"),
    ("/v1/chat/completions", {"model": MODEL, "messages": MSG, "response_format": {"type": "json_schema",
                                                                                  "json_schema": "x"}},
     "response_format.json_schema"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "response_format": {"type": "json_schema", "json_schema": [1]}},
     "response_format.json_schema"),
    # Not valid JSON Schema, though xgrammar compiled the first (to a grammar nothing matches: empty answers)
    ("/v1/chat/completions", {"model": MODEL, "messages": MSG, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"anyOf": []}}}}, "response_format.json_schema.schema"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "structured_outputs": {"json": {"type": 5}}},
     "structured_outputs.json"),
    # Past the limits of Dynamo's completions API, which carries every generation (it would refuse them naming
    # no field)
    ("/v1/chat/completions", {"model": MODEL, "messages": MSG, "top_k": 2**31}, "top_k"),
    ("/v1/chat/completions", {"model": MODEL, "messages": MSG, "repetition_penalty": 2.5}, "repetition_penalty"),
    ("/v1/chat/completions", {"model": MODEL, "messages": MSG, "logprobs": True, "top_logprobs": 6}, "top_logprobs"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 6}, "logprobs"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stop_token_ids": list(range(33))}, "stop_token_ids"),
])
def test_wrong_values_and_types_name_the_field(stack, path, body, param):
    assert_error(post(stack, path, body), 400, param=param)


def test_values_at_the_engine_limits_are_served(stack):
    for path, body in [
        ("/v1/chat/completions", {"model": MODEL, "messages": MSG, "max_tokens": 2, "stop": [], "top_k": 2**31 - 1,
                                  "repetition_penalty": 2.0, "logprobs": True, "top_logprobs": 5}),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2, "logprobs": 5,
                             "stop_token_ids": list(range(32))}),
    ]:
        assert post(stack, path, body).status_code == 200


def requests_in_flight(stack) -> float:
    return httpx.get(f"{stack.url}/v1/status", timeout=60).json()["requests_in_flight"]


@pytest.mark.parametrize("path,body,header,sent", [
    ("/v1/chat/completions", {"session_id": "日本"}, "x-session-id", "日本"),
    ("/v1/chat/completions", {"user": "\U0001F600 50%", "stream": True}, "x-session-id", "\U0001F600 50%"),
    ("/v1/completions", {"session_id": "a\r\nx-evil: 1", "stream": True}, "x-session-id", "a\r\nx-evil: 1"),
    ("/v1/completions", {"user": "a\u0000b"}, "x-session-id", "a\u0000b"),
    ("/inference/v1/generate", {"request_id": "gen-\u00e9\n"}, "x-request-id", "gen-\u00e9\n"),
])
def test_ids_of_any_text_are_served_and_sent_back_percent_encoded(stack, path, body, header, sent):
    """A session id, `user` or request id may hold any text: header values cannot, so the response's headers
    (and the front door's to Dynamo) carry it percent-encoded. Such an id was a 500 after the engine's work,
    and on a stream it left the request counted in flight for good, which held the Batch API back."""
    prompt = {"/v1/chat/completions": {"messages": MSG}, "/v1/completions": {"prompt": "x"},
              "/inference/v1/generate": {"token_ids": [1, 2]}}[path]
    resp = post(stack, path, {"model": MODEL, "max_tokens": 2, **prompt, **body})
    assert resp.status_code == 200, resp.text
    assert unquote(resp.headers[header]) == sent and resp.headers[header].isascii()
    deadline = time.monotonic() + 10
    while requests_in_flight(stack) and time.monotonic() < deadline:  # a stream's bookkeeping ends after its body
        time.sleep(0.05)
    assert requests_in_flight(stack) == 0


def test_a_request_http_cannot_parse_is_an_openai_error_and_the_server_goes_on(stack):
    """A control character in a header value is refused by the HTTP parser, before the app sees the
    request (rollout_server/http_protocol.py): the answer is still an OpenAI error JSON."""
    url = urlsplit(stack.url)
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Session-ID: a\x01b\r\n"
               b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(request)
        answer = b"".join(iter(lambda: sock.recv(65536), b""))  # the server closes the connection
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer
    assert b"content-type: application/json" in head.lower(), head
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_http_request", error
    assert "header" in error["message"], error
    assert httpx.get(f"{stack.url}/v1/models", timeout=30).status_code == 200


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
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=MSG, max_completion_tokens=32768)
    assert err.value.body["param"] == "max_completion_tokens"


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 500_000}]}, "messages"),
    ("/v1/completions", {"prompt": ["x", "word " * 500_000]}, "prompt"),
])
def test_a_prompt_surely_over_the_context_window_is_refused_before_it_is_tokenized(stack, path, body, param):
    """2.5 MB of text is more tokens than the window holds whatever it says (tokenizing 20 MB took a minute)."""
    error = assert_error(post(stack, path, {"model": MODEL, "max_tokens": 1, **body}), 400, param=param,
                         code="context_length_exceeded")
    assert "at least" in error["message"]


def test_unsupported_content_part_is_named(stack):
    body = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    assert_error(post(stack, "/v1/chat/completions", body), 400, param="messages.0.content")


def test_errors_are_counted_not_fatal(stack, client):
    """After all the bad requests above the stack still serves."""
    reply = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=2)
    assert reply.choices[0].finish_reason in ("length", "stop")
