"""A tool call that is valid by construction, through the openai SDK.

    scripts/serve &          # then:
    .venv/bin/python examples/chat_with_tools.py
"""

import json

import openai

client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="local")  # any key in open local mode
weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,12}$"},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}

raw = client.chat.completions.with_raw_response.create(
    model="tiny-qwen2", messages=[{"role": "user", "content": "What is the weather in Paris?"}],
    tools=[weather], tool_choice="required", parallel_tool_calls=False, max_tokens=200, seed=0,
    extra_headers={"X-Session-ID": "example-session"})
reply = raw.parse()
call = reply.choices[0].message.tool_calls[0]
print("finish_reason:", reply.choices[0].finish_reason)
print("call:", call.function.name, json.loads(call.function.arguments))
print("served by worker", raw.headers["x-worker-id"], "at policy version", raw.headers["x-policy-version"])
