"""Asynchronous RL through rollout-serve, in one command: watch the tiny model learn an answer format.

    .venv/bin/python examples/async_rl.py            # starts its own stack; about 3 minutes on 2 cores
    .venv/bin/python examples/async_rl.py --mode sync --url http://127.0.0.1:8000 --state-dir <its state dir>

The task: arithmetic questions ("What is 31 + 7? Answer with the number only."), and a format reward: the
fraction of the reply's `--max-tokens` tokens that are digits. The tiny model cannot add, but it can learn to
answer in digits; it starts near 0.01 (it writes text) and a format reward is dense, so a few dozen
policy-gradient steps move it (a format reward is also what RL teaches a model first in practice).

The loop, as a trainer wires rollout-serve:
- rollouts come from verifiers' train-mode client (examples/async_rl_rollouts.py, in the clients' venv): groups
  of `--samples` samples of one prompt, one session id per group (one worker, the prompt's KV shared), token ids
  and logprobs back from /inference/v1/generate, with each token's policy version;
- each step takes one batch of groups, posts their rewards to /v1/traces/rewards, and makes one GRPO-style
  step in torch: group-normalised advantages, a PPO-clipped importance ratio per token against the logprob the
  server sampled it with; the tokens a version older than the trainer's sampled are the off-policy ones, known
  from their versions;
- after each step the weights go to every worker with the tensor transport (finetune_deploy/trainer_client.py,
  in_flight keep): rollouts never stop;
- async (the default): the next batch is already generating while a step trains and pushes (one batch ahead,
  `max_policy_lag` 1 bounds it in the server); sync: generate a batch, train, push, then the next batch.
At the end: the RL dataset exported from the served traces and loaded with `datasets`, and a PNG of reward and
policy version over time.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from finetune_deploy.trainer_client import WeightPusher, attach_rewards, export_rl_dataset  # noqa: E402

CLIENTS_PYTHON = REPO / ".venv-clients" / "bin" / "python"
CLIP = 0.2  # PPO's ratio clip


@dataclass
class Step:
    """One training step, as the example logs it."""

    step: int
    seconds: float           # since the loop began, when the step's weights were pushed
    reward: float            # mean reward of the batch it trained on
    version: int             # the policy version it pushed
    tokens: int              # completion tokens in the batch
    off_policy_tokens: int   # of them, sampled by a version older than the trainer's
    push_pause_s: float      # the workers' pause for the push (the server's record)
    waited_s: float          # the trainer waiting for the batch to come back
    trained_s: float         # the step in torch
    pushed_s: float          # the push, as the trainer sees it


@dataclass
class History:
    mode: str
    steps: list[Step] = field(default_factory=list)
    rollouts: int = 0
    lost: list[str] = field(default_factory=list)  # groups (with their error) or samples that did not come back whole
    served: dict[str, dict] = field(default_factory=dict)  # request id -> its completion ids and their versions
    wall_s: float = 0.0

    def start_reward(self) -> float:
        return self.steps[0].reward

    def smoothed(self, i: int, window: int = 3) -> float:
        return statistics.mean(s.reward for s in self.steps[max(0, i - window + 1):i + 1])

    def seconds_to(self, target: float) -> float | None:
        """When the reward (a 3-step mean) first reached `target`."""
        return next((s.seconds for i, s in enumerate(self.steps) if self.smoothed(i) >= target), None)


class Rollouts:
    """The rollout process (verifiers' train-mode client) and the groups it writes back."""

    def __init__(self, url: str, model_dir: Path, samples: int, max_tokens: int, max_policy_lag: int, seed: int,
                 run: str):
        self.process = subprocess.Popen(
            [str(CLIENTS_PYTHON), str(REPO / "examples" / "async_rl_rollouts.py"), "--url", url,
             "--model-dir", str(model_dir), "--samples", str(samples), "--max-tokens", str(max_tokens),
             "--max-policy-lag", str(max_policy_lag), "--seed", str(seed), "--run", run],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})  # its transformers has no torch: not needed
        self.groups: queue.Queue[dict] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def ask(self, groups: int) -> None:
        self.process.stdin.write(json.dumps({"groups": groups}) + "\n")
        self.process.stdin.flush()

    def take(self, groups: int, timeout_s: float = 300) -> list[dict]:
        return [self.groups.get(timeout=timeout_s) for _ in range(groups)]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=120)

    def _read(self) -> None:
        for line in self.process.stdout:
            self.groups.put(json.loads(line))


class Trainer:
    """The policy in torch, its optimiser, and the reward."""

    def __init__(self, model_dir: Path, lr: float, max_tokens: int):
        torch.set_num_threads(1)  # the server's workers have the other core
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.digits = {i for i in range(len(tokenizer)) if tokenizer.decode([i]).strip().isdigit()}
        self.max_tokens = max_tokens

    def reward(self, completion_ids: list[int]) -> float:
        """The fraction of the reply's max_tokens tokens that are digits."""
        return sum(token in self.digits for token in completion_ids) / self.max_tokens

    def step(self, groups: list[dict], version: int) -> tuple[int, int]:
        """One GRPO-style step on the groups' samples; returns (tokens, off-policy tokens). The trainer's weights
        are `version`: a token sampled by an older version is off-policy, its ratio far from 1."""
        rows = []  # (ids, prompt length, behaviour logprobs, advantage)
        tokens = off_policy = 0
        for group in groups:
            rewards = [self.reward(s["completion_ids"]) for s in group["samples"]]
            mean, spread = statistics.mean(rewards), statistics.pstdev(rewards)
            for sample, reward in zip(group["samples"], rewards):
                versions = token_versions(sample["policy_versions"], len(sample["completion_ids"]))
                tokens += len(versions)
                off_policy += sum(v < version for v in versions)
                if spread > 0 and sample["completion_ids"]:
                    rows.append((sample["prompt_ids"] + sample["completion_ids"], len(sample["prompt_ids"]),
                                 sample["logprobs"], (reward - mean) / spread))
        if not rows:
            return tokens, off_policy
        width = max(len(ids) for ids, *_ in rows)
        ids = torch.tensor([r[0] + [0] * (width - len(r[0])) for r in rows])
        mask = torch.tensor([[1] * len(r[0]) + [0] * (width - len(r[0])) for r in rows])
        logprobs = torch.log_softmax(self.model(input_ids=ids, attention_mask=mask).logits.float(), -1)
        losses = []
        for row, (sequence, prompt_length, behaviour, advantage) in enumerate(rows):
            positions = torch.arange(prompt_length - 1, len(sequence) - 1)
            current = logprobs[row, positions, torch.tensor(sequence[prompt_length:])]
            ratio = torch.exp(current - torch.tensor(behaviour))
            losses.append(-torch.min(ratio * advantage, ratio.clamp(1 - CLIP, 1 + CLIP) * advantage))
        loss = torch.cat(losses).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return tokens, off_policy


def token_versions(runs: list[dict], tokens: int) -> list[int]:
    """Each completion token's policy version, from the response's runs [{version, first_token_index}]."""
    versions = []
    for run, following in zip(runs, [*runs[1:], None]):
        end = following["first_token_index"] if following else tokens
        versions += [run["version"]] * (end - run["first_token_index"])
    return versions


def run_loop(url: str, mode: str, args, log=print) -> History:
    """The RL loop against a running server (its weights at version 0 when it starts)."""
    served = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]
    model_dir, version = Path(served["root"]), int(served["policy_version"])
    trainer = Trainer(model_dir, args.lr, args.max_tokens)
    pusher = WeightPusher.connect(url, trainer.model, api_key=args.api_key)
    rollouts = Rollouts(url, model_dir, args.samples, args.max_tokens, 1, args.seed, f"{mode}-{args.seed}")
    history, started = History(mode), time.monotonic()
    torch.manual_seed(args.seed)
    batches_asked = 2 if mode == "async" else 1  # async: one batch ahead, generating while a step trains and pushes
    for _ in range(batches_asked):
        rollouts.ask(args.groups)
    try:
        for number in range(args.steps):
            asked = time.monotonic()
            groups = rollouts.take(args.groups)
            taken = time.monotonic()
            lost = [f'{g["group"]}: {g["error"]}' for g in groups if "error" in g]
            groups = [g for g in groups if "error" not in g]
            history.lost += lost + [s["request_id"] for g in groups for s in g["samples"]
                                    if s["finish_reason"] not in ("stop", "length")]
            history.rollouts += sum(len(g["samples"]) for g in groups)
            history.served.update({s["request_id"]: {
                "completion_ids": s["completion_ids"],
                "versions": token_versions(s["policy_versions"], len(s["completion_ids"]))}
                for g in groups for s in g["samples"]})
            attach_rewards(url, [{"request_id": s["request_id"], "reward": trainer.reward(s["completion_ids"])}
                                 for g in groups for s in g["samples"]], api_key=args.api_key)
            reward = statistics.mean(trainer.reward(s["completion_ids"]) for g in groups for s in g["samples"])
            trained = time.monotonic()
            tokens, off_policy = trainer.step(groups, version)
            trained = time.monotonic() - trained
            version += 1
            pushed = pusher.push(version)
            if number + batches_asked < args.steps:
                rollouts.ask(args.groups)
            history.steps.append(Step(number, time.monotonic() - started, reward, version, tokens, off_policy,
                                      max(pushed["pauses_s"], default=0.0), taken - asked, trained,
                                      pushed["push_s"]))
            log(f"{mode} step {number:3d}  {history.steps[-1].seconds:6.1f} s  reward {reward:.3f}  "
                f"version {version}  off-policy tokens {off_policy}/{tokens}  (waited {taken - asked:.2f} s, "
                f"trained {trained:.2f} s, pushed {pushed['push_s']:.2f} s)")
            if time.monotonic() - started > args.minutes * 60:
                log(f"{mode}: the {args.minutes:g}-minute budget is spent")
                break
    finally:
        rollouts.close()
        pusher.close()
    history.wall_s = time.monotonic() - started
    return history


def figure(histories: list[History], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    fig, ax = pyplot.subplots(figsize=(8, 4))
    versions = ax.twinx()
    for history in histories:
        seconds = [s.seconds for s in history.steps]
        line, = ax.plot(seconds, [s.reward for s in history.steps], label=f"reward ({history.mode})")
        versions.plot(seconds, [s.version for s in history.steps], color=line.get_color(), alpha=0.35,
                      linestyle=":", label=f"policy version ({history.mode})")
    ax.set_xlabel("seconds")
    ax.set_ylabel("mean reward of the batch (digits in the answer)")
    versions.set_ylabel("policy version pushed (dotted)")
    ax.set_title("RL through rollout-serve: tiny model, 2-core CPU")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def add_loop_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=80, help="training steps at most")
    parser.add_argument("--minutes", type=float, default=10.0, help="stop after this long")
    parser.add_argument("--groups", type=int, default=16, help="prompts per step")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt (a group)")
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--api-key", default=None, help="an admin key (none in open local mode)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("async", "sync"), default="async")
    parser.add_argument("--url", help="a running server (its weights at the base model); default: start one")
    parser.add_argument("--state-dir", type=Path, help="that server's state directory (for the export)")
    parser.add_argument("--out", type=Path, default=Path("async_rl_out"), help="dataset, PNG and log")
    add_loop_arguments(parser)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    stack = None
    if args.url is None:
        from rollout_server.harness.stack import start_stack

        print("starting a stack (one float32 worker) ...", flush=True)
        stack = start_stack(Path(tempfile.mkdtemp(prefix="async-rl-")), workers=1, extra_args=["--dtype", "float32"])
        args.url, args.state_dir = stack.url, stack.state_dir
    try:
        history = run_loop(args.url, args.mode, args)
        rise = max(s.reward for s in history.steps) - history.start_reward()
        print(f"reward {history.start_reward():.3f} -> {history.steps[-1].reward:.3f} (best rise {rise:+.3f}) in "
              f"{history.wall_s:.0f} s, {len(history.steps)} steps, {history.rollouts} rollouts, "
              f"{len(history.lost)} lost")
        (args.out / "history.json").write_text(json.dumps(asdict(history), indent=1))
        figure([history], args.out / "reward.png")
        if args.state_dir is not None:
            dataset = export_rl_dataset(args.state_dir / "traces", args.out / "dataset", served=history.served.keys())
            print(f"exported {len(dataset)} rows with {', '.join(dataset.column_names)}")
        print(f"wrote {args.out}/ (history.json, reward.png, dataset/)")
    finally:
        if stack is not None:
            stack.stop()


if __name__ == "__main__":
    main()
