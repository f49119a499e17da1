"""The rollout side of examples/async_rl.py: verifiers' train-mode client, as an RL trainer's orchestrator drives it.

Runs in the clients' venv (verifiers pins dependencies vLLM's venv cannot take; scripts/bootstrap makes it):

    .venv-clients/bin/python examples/async_rl_rollouts.py --url http://127.0.0.1:8000 --model-dir <model dir>

It reads one JSON command per line on stdin, `{"groups": k}`, starts k groups at once, and writes one JSON line
per group to stdout as soon as the group's samples are all back. A group is `--samples` samples of one prompt
(an arithmetic question), sent with one session id so that they land on one worker and share the prompt's KV.
Each request goes to /inference/v1/generate through verifiers' `TrainClient` (the prompt rendered on the client
with its Qwen3 renderer, token ids in and out), with `max_policy_lag` in its sampling parameters.

verifiers 0.4 keeps what its own types hold (ids, logprobs, text, a finish reason among stop/length/tool_calls);
the per-token policy versions of each response (`policy_versions`) and a `policy_lag` finish reason are kept
here, by request id, from the response as renderers' client parses it (`renderers.client.parse_generate_response`).
stdin closed: the groups running finish, then the process exits.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import sys

import renderers.client
from renderers import Qwen3RendererConfig
from verifiers.v1 import SamplingConfig, TrainClientConfig
from verifiers.v1.clients import TrainClient
from verifiers.v1.dialects import ChatDialect

KEY_VARIABLE = "ROLLOUT_SERVE_API_KEY"
_served: dict[str, dict] = {}  # request id -> what verifiers drops of its response


def _keep_what_verifiers_drops() -> None:
    parse = renderers.client.parse_generate_response

    def parse_keeping(raw: bytes) -> dict:
        payload = parse(raw)
        choice = (payload.get("choices") or [{}])[0]
        _served[payload.get("request_id") or ""] = {"policy_versions": choice.get("policy_versions") or [],
                                                    "finish_reason": choice.get("finish_reason")}
        return payload

    renderers.client.parse_generate_response = parse_keeping


def question(rng: random.Random) -> str:
    a, b = rng.randrange(100), rng.randrange(100)
    return f"What is {a} + {b}? Answer with the number only."


async def sample(client: TrainClient, prompt: str, group: str, sampling: SamplingConfig) -> dict:
    body = {"model": "tiny-qwen2", "messages": [{"role": "user", "content": prompt}]}
    response = await client.get_response(ChatDialect(), body, sampling, session_id=group)
    served = _served.pop(response.id, {})
    return {"request_id": response.id, "prompt_ids": list(response.tokens.prompt_ids),
            "completion_ids": list(response.tokens.completion_ids),
            "logprobs": list(response.tokens.completion_logprobs), "text": response.message.content or "",
            "finish_reason": served.get("finish_reason") or response.finish_reason,
            "policy_versions": served.get("policy_versions", [])}


async def group(client: TrainClient, number: int, prompt: str, args) -> dict:
    name = f"{args.run}-group-{number}"
    sampling = SamplingConfig(temperature=1.0, max_tokens=args.max_tokens, max_policy_lag=args.max_policy_lag)
    samples = await asyncio.gather(*(sample(client, prompt, name, sampling) for _ in range(args.samples)))
    return {"group": name, "prompt": prompt, "samples": samples}


async def main(args) -> None:
    _keep_what_verifiers_drops()
    config = TrainClientConfig(base_url=f"{args.url.rstrip('/')}/v1", api_key_var=KEY_VARIABLE,
                               renderer=Qwen3RendererConfig(), renderer_model_name=args.model_dir)
    client, rng, numbers = TrainClient(config), random.Random(args.seed), itertools.count()
    running: set[asyncio.Task] = set()
    out = asyncio.Lock()

    async def run_and_write(number: int, prompt: str) -> None:
        try:
            result = await group(client, number, prompt, args)
        except Exception as exc:  # the trainer counts it: a group lost
            result = {"group": f"{args.run}-group-{number}", "prompt": prompt, "error": repr(exc)}
        async with out:
            sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()

    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        for _ in range(json.loads(line)["groups"]):
            task = asyncio.create_task(run_and_write(next(numbers), question(rng)))
            running.add(task)
            task.add_done_callback(running.discard)
    await asyncio.gather(*running)
    await client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the server's base URL")
    parser.add_argument("--model-dir", required=True, help="the served model's directory (its tokenizer renders)")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt (a group)")
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--max-policy-lag", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0, help="of the questions")
    parser.add_argument("--run", default="rl", help="prefix of the groups' session ids")
    os.environ.setdefault(KEY_VARIABLE, "local")
    asyncio.run(main(parser.parse_args()))
