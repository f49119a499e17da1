"""verifiers' Qwen3 renderer and the tiny model's chat template give the same ids for the same conversation.

Train mode renders prompts on the client (verifiers 0.4 with `--client.renderer.name qwen3`) and sends ids;
eval mode sends messages and the front door renders them with the model's template. The same conversation
must be the same ids both ways, or a policy trained on one sees other prompts than it is served. The renderer
runs in the clients' venv (its own, as verifiers installs it); the template through the front door's own
tokenizer. What is compared is every prompt shape a tool-using rollout sends: conversations ending with a
user or tool turn, with a generation prompt.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from rollout_server.tokenizer import ModelTokenizer
from tests.api.clients.venvs import CLIENTS_VENV, client_command
from tests.tiny_models import untrained_tiny_model

ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                        "parameters": {"type": "object", "required": ["a", "b"],
                                                       "properties": {"a": {"type": "integer"},
                                                                      "b": {"type": "integer"}}}}}
NOW = {"type": "function", "function": {"name": "now", "description": "The time, ISO 8601, in a zone.",
                                        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
CALL2 = {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": '{"zone": "UTC"}'}}

CONVERSATIONS = {
    "user only": ([{"role": "user", "content": "Hi there."}], None),
    "system and user": ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."}], None),
    "tools, no system": ([{"role": "user", "content": "What is 2 + 3? Use the add tool."}], [ADD]),
    "tools and system": ([{"role": "system", "content": "You add numbers."},
                          {"role": "user", "content": "What is 2 + 3?"}], [ADD, NOW]),
    "after a tool result": ([{"role": "user", "content": "What is 2 + 3?"},
                             {"role": "assistant", "content": "", "tool_calls": [CALL]},
                             {"role": "tool", "tool_call_id": "call_1", "content": "5"}], [ADD]),
    "two calls, two results, text": ([{"role": "user", "content": "Add 2 and 3, and tell me the time."},
                                      {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL, CALL2]},
                                      {"role": "tool", "tool_call_id": "call_1", "content": "5"},
                                      {"role": "tool", "tool_call_id": "call_2", "content": "12:00"}], [ADD, NOW]),
    "a second query": ([{"role": "user", "content": "What is 2 + 3?"},
                        {"role": "assistant", "content": "", "tool_calls": [CALL]},
                        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
                        {"role": "assistant", "content": "It is 5."},
                        {"role": "user", "content": "And the time?"}], [ADD, NOW]),
    "reasoning after the query": ([{"role": "user", "content": "What is 2 + 3?"},
                                   {"role": "assistant", "content": "", "reasoning_content": "I should add.",
                                    "tool_calls": [CALL]},
                                   {"role": "tool", "tool_call_id": "call_1", "content": "5"}], [ADD]),
    "reasoning in an earlier turn": ([{"role": "user", "content": "Hi."},
                                      {"role": "assistant", "content": "<think>\nA greeting.\n</think>\n\nHello!"},
                                      {"role": "user", "content": "Bye."}], None),
}

RENDER = """
import json, sys
from renderers import Qwen3RendererConfig, create_renderer
from renderers.base import load_tokenizer
model_dir, conversations = sys.argv[1], json.load(sys.stdin)
renderer = create_renderer(load_tokenizer(model_dir), Qwen3RendererConfig())
print(json.dumps({name: renderer.render_ids(messages, tools=tools, add_generation_prompt=True)
                  for name, (messages, tools) in conversations.items()}))
"""


@pytest.fixture(scope="module")
def renderer_ids() -> dict[str, list[int]]:
    python = client_command(CLIENTS_VENV, "python")
    done = subprocess.run([str(python), "-c", RENDER, str(untrained_tiny_model())], input=json.dumps(CONVERSATIONS),
                          check=False, capture_output=True, text=True, timeout=120, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_the_renderer_and_the_chat_template_give_the_same_ids(name, renderer_ids):
    messages, tools = CONVERSATIONS[name]
    tokenizer = ModelTokenizer(untrained_tiny_model())
    ours = tokenizer.render_chat(messages, tools, add_generation_prompt=True)
    theirs = renderer_ids[name]
    if ours != theirs:
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        pytest.fail(f"ids differ from position {first}:\n template: {tokenizer.hf.decode(ours[first:first + 20])!r}\n"
                    f" renderer: {tokenizer.hf.decode(theirs[first:first + 20])!r}")
