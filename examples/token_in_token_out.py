"""Token in, token out, as an RL trainer (verifiers' train mode) uses it: exact ids and logprobs.

    scripts/serve &          # then:
    .venv/bin/python examples/token_in_token_out.py
"""

import httpx
from transformers import AutoTokenizer

from rollout_server.tiny_model.builder import ensure_tiny_model

tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_model())
prompt = tokenizer.apply_chat_template([{"role": "user", "content": "solve the task"}], add_generation_prompt=True,
                                       tokenize=True, return_dict=False)
reply = httpx.post("http://127.0.0.1:8000/inference/v1/generate", timeout=120, json={
    "model": "tiny-qwen2", "token_ids": prompt,
    "sampling_params": {"max_tokens": 8, "temperature": 1.0, "logprobs": 1, "seed": 1}}).json()
choice = reply["choices"][0]
for token_id, entry in zip(choice["token_ids"], choice["logprobs"]["content"]):
    print(f"{token_id:6d} {entry['logprob']:8.3f} {tokenizer.decode([token_id])!r}")
print("finish_reason:", choice["finish_reason"], " policy_version:", reply["policy_version"])
