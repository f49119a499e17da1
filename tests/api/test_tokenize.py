"""vLLM's /tokenize and /detokenize: the ids a chat request is served on, and back to text."""

import httpx
import pytest
from transformers import AutoTokenizer

from tests.tiny_models import trained_tiny_model

pytestmark = pytest.mark.stack

MODEL = "tiny-qwen2"
TOOLS = [{"type": "function", "function": {"name": "grep", "parameters": {
    "type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]}}}]
MESSAGES = [{"role": "system", "content": "You search code."}, {"role": "user", "content": "Where is main() defined?"}]


@pytest.fixture(scope="module")
def hf():
    return AutoTokenizer.from_pretrained(trained_tiny_model())


def post(stack, path: str, body: dict, **headers) -> httpx.Response:
    return httpx.post(f"{stack.url}{path}", json=body, headers=headers, timeout=60)


def test_tokenized_messages_are_the_ids_a_chat_request_is_served_on(stack, client, hf):
    tokenized = post(stack, "/tokenize", {"model": MODEL, "messages": MESSAGES, "tools": TOOLS}).json()
    served = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=1,
                                            extra_body={"return_token_ids": True})
    assert tokenized["tokens"] == served.model_extra["prompt_token_ids"]
    assert tokenized["count"] == len(tokenized["tokens"]) == served.usage.prompt_tokens
    assert tokenized["max_model_len"] == client.models.list().data[0].model_extra["max_model_len"]
    assert tokenized["token_strs"] is None
    assert tokenized["tokens"] == hf.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True,
                                                         tokenize=True, return_dict=False)


def test_a_text_prompt_is_tokenized_with_the_tokenizers_special_tokens_unless_asked_not_to(stack, hf):
    text = "def main():\n    return 0"
    got = post(stack, "/tokenize", {"prompt": text, "return_token_strs": True}).json()
    assert got["tokens"] == hf.encode(text, add_special_tokens=True)
    assert got["token_strs"] == hf.convert_ids_to_tokens(got["tokens"])
    bare = post(stack, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()
    assert bare["tokens"] == hf.encode(text, add_special_tokens=False)


def test_detokenize_gives_back_the_rendered_prompt_with_its_special_tokens(stack, hf):
    ids = post(stack, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False}).json()["tokens"]
    back = post(stack, "/detokenize", {"model": MODEL, "tokens": ids}).json()
    assert back["prompt"] == hf.apply_chat_template(MESSAGES, tokenize=False)
    assert back["prompt"].startswith("<|im_start|>system\n")


@pytest.mark.parametrize("path, body, status, param", [
    ("/tokenize", {"prompt": "a", "messages": MESSAGES}, 400, "messages"),
    ("/tokenize", {}, 400, "messages"),
    ("/tokenize", {"messages": []}, 400, "messages"),
    ("/tokenize", {"model": "no-such-model", "prompt": "a"}, 404, "model"),
    ("/tokenize", {"messages": [{"role": "robot", "content": "hi"}]}, 400, "messages.0.role"),
    ("/tokenize", {"messages": MESSAGES, "chat_template": "{{ messages }}"}, 400, "chat_template"),
    # tools a chat request would be refused, whatever its tool_choice
    ("/tokenize", {"messages": MESSAGES, "tools": [{"type": "function", "function": "grep"}]}, 400, "tools[0].function"),
    ("/tokenize", {"messages": MESSAGES, "tools": TOOLS + TOOLS}, 400, "tools[1].function.name"),
    ("/tokenize", {"messages": MESSAGES, "tools": [{"type": "function", "function": {
        "name": "grep", "parameters": {"type": "object", "properties": {"n": {"type": 5}}}}}]}, 400, "tools[0].function.parameters"),
    ("/detokenize", {"tokens": [1, 10**9]}, 400, "tokens"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens.0"),
    ("/detokenize", {"tokens": "1 2 3"}, 400, "tokens"),
])
def test_bad_tokenize_requests_name_the_field(stack, path, body, status, param):
    resp = post(stack, path, body)
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["param"] == param


def test_a_named_sessions_next_turn_is_tokenized_exactly(stack, hf):
    """The second call starts from the ids kept for the session's first; the ids are still the whole's."""
    first = MESSAGES + [{"role": "assistant", "content": "In main.py."}]
    second = first + [{"role": "user", "content": "And where is it called?"}]
    for messages in (first, second):
        got = post(stack, "/tokenize", {"messages": messages}, **{"X-Session-ID": "tokenize-session"}).json()
        assert got["tokens"] == hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                       return_dict=False)
