"""examples/async_rl.py's loop, shortened, on the real stack: verifiers' train-mode client drives the rollouts, a
trainer in this process learns from them and pushes its weights every step while the next batch generates."""

from __future__ import annotations

import argparse
import statistics

import pytest

from examples.async_rl import run_loop
from finetune_deploy.trainer_client import export_rl_dataset
from rollout_server.harness.stack import start_stack
from tests.api.clients.venvs import CLIENTS_VENV, client_command

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    client_command(CLIENTS_VENV, "python")  # a clear failure when the clients' venv is missing
    running = start_stack(tmp_path_factory.mktemp("rl-stack"), workers=1, extra_args=["--dtype", "float32"])
    yield running
    running.stop()


def test_a_short_async_loop_learns_and_every_exported_token_says_its_version(stack, tmp_path):
    args = argparse.Namespace(steps=14, minutes=3.0, groups=8, samples=4, max_tokens=12, lr=1e-3, seed=0,
                              api_key=None)
    history = run_loop(stack.url, "async", args)

    rewards = [s.reward for s in history.steps]
    assert len(rewards) == args.steps, "the loop stopped before its steps (the time budget)"
    assert statistics.mean(rewards[-3:]) > statistics.mean(rewards[:3]), rewards
    assert [s.version for s in history.steps] == list(range(1, args.steps + 1))  # a push every step
    # Every rollout asked for came back whole: no group lost, none ended early (a lag cut or an error)
    assert not history.lost and history.rollouts == args.steps * args.groups * args.samples
    assert sum(s.off_policy_tokens for s in history.steps) > 0  # async: some tokens came from the version before

    dataset = export_rl_dataset(stack.state_dir / "traces", tmp_path / "dataset", served=history.served.keys())
    rows = {row["request_id"]: row for row in dataset}
    assert history.served.keys() <= rows.keys()
    for request_id, served in history.served.items():
        row = rows[request_id]
        completion = [i for i, m in enumerate(row["mask"]) if m]
        assert [row["token_ids"][i] for i in completion] == served["completion_ids"]
        assert [row["policy_versions"][i] for i in completion] == served["versions"]
        assert row["reward"] is not None
