"""Tool calls valid by construction, through the openai SDK, for both call formats.

The Hermes format runs on the shared stack (the tiny model's default template); the
XML-parameter format on a one-worker stack serving the same weights with a
Qwen3-Coder-style template.
"""

import json
import re

import jsonschema
import openai
import pytest

from rollout_server.harness.stack import start_stack
from tests.tiny_models import trained_tiny_model

pytestmark = pytest.mark.stack

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"},
                                     "unit": {"enum": ["celsius", "fahrenheit"]},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit"], "additionalProperties": False}}}
EDIT = {"type": "function", "function": {"name": "edit_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string", "pattern": "^[a-z_/]{1,16}[.]py$"}, "line": {"type": "integer"},
                                     "replace": {"type": "boolean"}},
    "required": ["path", "line"], "additionalProperties": False}}}
# Literal '<', a closing tag, escaped quotes, a backslash and non-ASCII text inside an argument: they must come
# back byte for byte. xgrammar applies `pattern` to the string as written, so the pattern spells the written
# form: JSON escapes in the Hermes format, raw text in the XML format (whose values are not JSON strings).
WRITTEN = 'if a<b: print(\\"x\\") </tool_call> \\\\ é 日本'
TRICKY = {"type": "function", "function": {"name": "write_code", "parameters": {
    "type": "object", "properties": {"code": {"type": "string", "pattern": "^" + re.sub(r"([\\.^$*+?()\[\]{}|])", r"\\\1", WRITTEN) + "$"}},
    "required": ["code"], "additionalProperties": False}}}
EXPECTED_CODE = {"hermes": json.loads(f'"{WRITTEN}"'), "xml": WRITTEN}
TOOLS = [WEATHER, EDIT]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS + [TRICKY]}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris? Then fix line 3 of main.py."}]


@pytest.fixture(scope="module", params=["hermes", "xml"])
def tool_client(request, stack, client, tmp_path_factory):
    if request.param == "hermes":
        client.tool_format = "hermes"
        yield client
        return
    model_dir = trained_tiny_model(0, tool_format="xml")
    xml_stack = start_stack(tmp_path_factory.mktemp("xml-stack"), workers=1,
                            extra_args=["--model", str(model_dir), "--served-model-name", "tiny-qwen2"])
    xml_client = openai.OpenAI(base_url=f"{xml_stack.url}/v1", api_key="open", max_retries=0, timeout=120)
    xml_client.tool_format = "xml"
    yield xml_client
    xml_stack.stop()


def assert_valid_calls(message, finish_reason="tool_calls"):
    """Every call is declared and schema-valid; after "length" the last call may be cut short."""
    assert message.tool_calls, f"no tool calls in {message}"
    complete = message.tool_calls[:-1] if finish_reason == "length" else message.tool_calls
    for call in complete:
        assert call.id.startswith("call_") and call.type == "function"
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, SCHEMAS[call.function.name])


def ask(client, **kwargs):
    params = dict(model="tiny-qwen2", messages=MESSAGES, tools=TOOLS, max_tokens=400, temperature=1.0)
    params.update(kwargs)
    return client.chat.completions.create(**params)


def test_required_gives_valid_calls(tool_client):
    for seed in range(3):
        choice = ask(tool_client, tool_choice="required", parallel_tool_calls=False, seed=seed).choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        assert_valid_calls(choice.message)


def test_named_function_is_the_only_call(tool_client):
    choice = ask(tool_client, tool_choice={"type": "function", "function": {"name": "edit_file"}}, seed=1).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [c.function.name for c in choice.message.tool_calls] == ["edit_file"]
    assert_valid_calls(choice.message)


def test_none_and_auto(tool_client):
    none = ask(tool_client, tool_choice="none", max_tokens=20, seed=2).choices[0]
    assert not none.message.tool_calls and none.message.content
    for seed in range(3):
        auto = ask(tool_client, tool_choice="auto", seed=seed).choices[0]
        if auto.message.tool_calls:
            assert auto.finish_reason in ("tool_calls", "length")
            assert_valid_calls(auto.message, auto.finish_reason)
        else:
            assert auto.finish_reason in ("stop", "length")


def test_parallel_tool_calls_honoured_both_ways(tool_client):
    counts = []
    for seed in range(16):  # the trained tiny model mostly makes one call; seeds 10-14 include more
        single = ask(tool_client, tool_choice="required", parallel_tool_calls=False, seed=seed).choices[0]
        assert len(single.message.tool_calls) == 1
        assert_valid_calls(single.message)
        many = ask(tool_client, tool_choice="required", parallel_tool_calls=True, seed=seed).choices[0]
        assert many.finish_reason in ("tool_calls", "length")
        assert_valid_calls(many.message, many.finish_reason)
        counts.append(len(many.message.tool_calls))
    assert max(counts) >= 2, f"parallel calls never produced more than one call: {counts}"


def test_streamed_calls_equal_the_non_streamed_ones(tool_client):
    whole = ask(tool_client, tool_choice="required", seed=4, parallel_tool_calls=False,
                extra_headers={"X-Session-ID": "tools-stream"}).choices[0]
    chunks = list(ask(tool_client, tool_choice="required", seed=4, parallel_tool_calls=False, stream=True,
                      extra_headers={"X-Session-ID": "tools-stream"}))
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for delta in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": delta.id, "name": delta.function.name, "arguments": ""})
            call["arguments"] += delta.function.arguments or ""
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert all(c["id"] and c["id"].startswith("call_") for c in calls.values())
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls]


def test_special_characters_come_back_byte_exact(tool_client):
    for stream in (False, True):
        reply = ask(tool_client, tools=[TRICKY], tool_choice="required", parallel_tool_calls=False, stream=stream,
                    max_tokens=200, seed=0)
        if stream:
            arguments = "".join(d.function.arguments or "" for c in reply for d in (c.choices[0].delta.tool_calls or [])
                                if c.choices)
        else:
            arguments = reply.choices[0].message.tool_calls[0].function.arguments
        assert json.loads(arguments)["code"] == EXPECTED_CODE[tool_client.tool_format]


def test_a_call_cut_by_max_tokens_is_never_a_silent_stop(tool_client):
    for stream in (False, True):
        for max_tokens in (3, 8, 14):
            reply = ask(tool_client, tool_choice="required", max_tokens=max_tokens, seed=5, stream=stream)
            if stream:
                finish = [c.choices[0].finish_reason for c in reply if c.choices][-1]
            else:
                finish = reply.choices[0].finish_reason
            assert finish == "length", f"max_tokens={max_tokens} stream={stream}: {finish}"


def test_bad_tool_requests_name_the_field(tool_client):
    with pytest.raises(openai.BadRequestError) as err:
        ask(tool_client, tool_choice={"type": "function", "function": {"name": "no_such_tool"}})
    assert err.value.body["param"].startswith("tool_choice")
    with pytest.raises(openai.BadRequestError) as err:
        tool_client.chat.completions.create(model="tiny-qwen2", messages=MESSAGES, tool_choice="required")
    assert err.value.body["param"] == "tool_choice"
    # Tools that are only rendered into the prompt are checked all the same
    for choice in ("none", "auto"):
        with pytest.raises(openai.BadRequestError) as err:
            ask(tool_client, tool_choice=choice, tools=[WEATHER, {"type": "function", "function": "grep"}])
        assert err.value.body["param"] == "tools[1].function"


def test_calls_and_results_go_back_into_the_conversation(tool_client):
    first = ask(tool_client, tool_choice="required", parallel_tool_calls=False, seed=6).choices[0].message
    call = first.tool_calls[0]
    history = MESSAGES + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                          {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'}]
    reply = tool_client.chat.completions.create(model="tiny-qwen2", messages=history, tools=TOOLS, max_tokens=8,
                                                tool_choice="none", extra_body={"return_token_ids": True})
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 100


# uniqueItems is beyond the grammar: calls are checked when finished, and a failing one sampled again
# (rollout_server/serving/call_repair.py). PICK_TWO can be written wrong ([1, 1]); PICK_NONE only wrong.
def pick(name: str, values: list[int]) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {"ids": {"type": "array", "items": {"enum": values}, "minItems": 2,
                                                 "maxItems": 2, "uniqueItems": True}},
        "required": ["ids"], "additionalProperties": False}}}


PICK_TWO, PICK_NONE = pick("pick_two", [1, 2]), pick("pick_none", [1])
PICK_MESSAGES = [{"role": "user", "content": "Pick two different ids."}]


def ask_pick(client, tool, **kwargs):
    return client.chat.completions.create(
        model="tiny-qwen2", messages=PICK_MESSAGES, tools=[tool], tool_choice="required", max_tokens=200,
        temperature=1.0, extra_body={"return_token_ids": True}, **kwargs)


def retried(reply) -> bool:
    """A repair sampled more tokens than the answer holds: its usage counts the discarded call's too."""
    return reply.usage.completion_tokens > sum(len(c.model_extra["token_ids"]) for c in reply.choices)


def test_a_call_breaking_a_checked_keyword_is_sampled_again_until_valid(tool_client):
    replies = [ask_pick(tool_client, PICK_TWO, seed=seed) for seed in range(8)]
    for reply in replies:
        choice = reply.choices[0]
        assert choice.finish_reason in ("tool_calls", "error"), choice
        for call in choice.message.tool_calls or []:
            jsonschema.validate(json.loads(call.function.arguments), PICK_TWO["function"]["parameters"])
    assert any(retried(r) and r.choices[0].finish_reason == "tool_calls" for r in replies), \
        [(r.choices[0].message, r.usage) for r in replies]


def test_a_call_no_retry_can_make_valid_ends_in_error_with_its_text_as_content(tool_client):
    reply = ask_pick(tool_client, PICK_NONE, seed=1)
    choice = reply.choices[0]
    assert choice.finish_reason == "error" and not choice.message.tool_calls
    assert "pick_none" in choice.message.content and retried(reply)
    chunks = list(ask_pick(tool_client, PICK_NONE, seed=1, stream=True))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "error"
    assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == choice.message.content


def test_a_strict_function_with_a_keyword_the_grammar_cannot_enforce_is_refused(tool_client):
    strict = {"type": "function", "function": {**PICK_TWO["function"], "strict": True}}
    with pytest.raises(openai.BadRequestError) as err:
        ask_pick(tool_client, strict)
    assert err.value.body["param"] == "tools[0].function.parameters.properties.ids.uniqueItems"
