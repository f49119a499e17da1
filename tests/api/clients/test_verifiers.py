"""verifiers 0.4, the RL client our users run, against the stack: eval mode and train mode, for real.

The taskset is `tiny_add` beside this file: four "add two numbers" tasks with one `add` tool, run by
`vf-eval` from the clients' venv (tests/api/clients/venvs.py) with its agent in a subprocess, no harness tools
and nothing pushed anywhere. Eval mode sends chat completions (the front door renders the template); train
mode renders on the client with verifiers' Qwen3 renderer and sends token ids to /inference/v1/generate.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rollout_server.tiny_model.builder import TINY_MODEL_NAME
from tests.api.clients.venvs import CLIENTS_VENV, client_command
from tests.api.test_traces_e2e import export
from tests.tiny_models import trained_tiny_model

pytestmark = pytest.mark.stack

TASKSET_DIR = Path(__file__).parent
ROLLOUTS = 4


def vf_eval(stack, out: Path, *mode_args: str) -> list[dict]:
    """Runs vf-eval on the tiny_add taskset; its episodes (traces.jsonl). vf-eval exits 0 even when rollouts
    fail, so the episodes are what the tests read."""
    command = [str(client_command(CLIENTS_VENV, "vf-eval")), "tiny-add", "-m", TINY_MODEL_NAME,
               "-n", str(ROLLOUTS), "-r", "1", "-c", "2", "--client.base-url", f"{stack.url}/v1",
               "--client.api-key-var", "ROLLOUT_SERVE_TEST_KEY", "--env.agent.runtime.type", "subprocess",
               "--env.agent.harness.id", "null", "--env.agent.max-turns", "3", "--sampling.max-tokens", "64",
               "--sampling.temperature", "0.7", "--no-push", "--no-rich", "-o", str(out), "--run.dir", "run",
               "--clean", "true", *mode_args]
    env = {**os.environ, "PATH": f"{CLIENTS_VENV / 'bin'}:{os.environ['PATH']}", "PYTHONPATH": str(TASKSET_DIR),
           "ROLLOUT_SERVE_TEST_KEY": "unused-in-open-mode", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, env=env, check=False, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    traces = out / "run" / "traces.jsonl"
    assert traces.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in traces.read_text().splitlines()]


def assert_no_errors(episodes: list[dict]) -> None:
    assert len(episodes) == ROLLOUTS
    problems = [(e["id"], e["errors"], e["traces"][0]["errors"], e["traces"][0]["stop_condition"])
                for e in episodes if not e["ok"] or e["errors"] or e["traces"][0]["errors"]]
    assert not problems, problems


def test_eval_mode_runs_every_rollout_with_the_tool(stack, tmp_path):
    episodes = vf_eval(stack, tmp_path / "eval")
    assert_no_errors(episodes)
    advertised = {tool["name"] for e in episodes for tool in e["traces"][0]["nodes"][0].get("tools", [])}
    assert advertised == {"add"}


def test_train_mode_sends_token_ids_and_the_traces_hold_exactly_them(stack, tmp_path):
    episodes = vf_eval(stack, tmp_path / "train", "--client.type", "train", "--client.renderer.name", "qwen3",
                       "--client.renderer-model-name", str(trained_tiny_model()))
    assert_no_errors(episodes)
    sent = sampled_calls(episodes)
    assert len(sent) >= ROLLOUTS
    prompts = {tuple(prompt) for prompt, _, _ in sent}

    served = records_by_prompt(export(stack, tmp_path, "raw", session=None,
                                      until=lambda rows: prompts <= records_by_prompt(rows).keys()))
    for prompt, completion, logprobs in sent:
        row = served.get(tuple(prompt))
        assert row is not None, f"no trace record of a generate request with the prompt verifiers sent ({len(prompt)} ids)"
        assert row["completion_token_ids"] == completion
        assert row["completion_logprobs"] == pytest.approx(logprobs, abs=1e-4)


def records_by_prompt(rows: list[dict]) -> dict[tuple[int, ...], dict]:
    return {tuple(row["prompt_token_ids"]): row for row in rows if row["endpoint"] == "generate"}


def sampled_calls(episodes: list[dict]) -> list[tuple[list[int], list[int], list[float]]]:
    """Each model call of a train-mode rollout as verifiers recorded it: the prompt ids it sent (every earlier
    node's ids, then this node's template ids before its first sampled one), the ids it received (the node's
    sampled ids) and their logprobs."""
    calls = []
    for episode in episodes:
        history: list[int] = []
        for node in episode["traces"][0]["nodes"]:
            ids, mask = node["token_ids"], node["mask"]
            if node["sampled"]:
                first = mask.index(True)
                calls.append((history + ids[:first], [t for t, m in zip(ids, mask) if m], node["logprobs"]))
            history += ids
    return calls
