"""RL weight updates while rollouts run: keep mode against finish (drain) and abort, from disk and pushed.

One stack (one float32 worker) serves a continuous RL rollout load: `--clients` concurrent clients, each
streaming sampled completions of `--max-tokens` tokens back to back. In each of four phases the trainer
updates the weights every `--update-every-s` seconds (two checkpoints alternate, so every update changes the
weights). The first three load them from disk through `POST /v1/rl/update_weights`, with `in_flight`:
- finish: each update pauses the worker in vLLM's `wait` mode: rollouts in flight run to their end first;
- abort:  they end at once with a retryable error; their tokens are discarded (the client would resample);
- keep:   they freeze, the weights change, they go on (each token stamped with the version that sampled it).
The fourth, transfer, is keep with no disk on the way: a trainer in this process (a transformers model)
broadcasts its weights to the worker (finetune_deploy/trainer_client.py, gloo, the CPU path).

Per phase: rollout tokens per second (tokens of rollouts that were not discarded, received in the phase),
tokens discarded, each update's pause (from the deployer's record: pause asked -> resumed). Then, for rollouts
of the keep and transfer phases that straddle an update, every served logprob around the boundary (8 tokens before, 16
after) is compared with transformers' logprob of the same token under the weights its stamp names, over the
KV keep mode keeps (the old weights' for the tokens before the boundary): a token off by more than 1e-3 counts
as version-mismatched.

Run: .venv/bin/python benchmarks/rl_sync.py   (about 7 minutes on 2 cores)
Writes benchmarks/results/rl_sync.json and benchmarks/results/rl_sync.png (tokens/s over time, three modes).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rollout_server.harness.checkpoints import copy_checkpoint  # noqa: E402
from rollout_server.harness.stack import CACHE_DIR, start_stack  # noqa: E402
from rollout_server.tiny_model.builder import ensure_tiny_model  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "rl_sync.json"
FIGURE = RESULTS.with_suffix(".png")
MODES = ("finish", "abort", "keep")  # in_flight, weights from disk
TRANSFER = "transfer"  # in_flight keep, weights broadcast by a trainer (gloo)
PROMPT_TOKENS = 32
LOGPROB_TOLERANCE = 1e-3
CHECKED_BEFORE, CHECKED_AFTER = 8, 16  # tokens checked on each side of a version boundary


@dataclass
class Rollout:
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # perf_counter of each token's arrival
    runs: list[dict] = field(default_factory=list)       # policy_versions, joined over the chunks
    error: str = ""


@dataclass
class Phase:
    mode: str
    start: float = 0.0
    end: float = 0.0
    rollouts: list[Rollout] = field(default_factory=list)
    updates: list[tuple[float, dict]] = field(default_factory=list)  # (perf_counter when asked, progress)

    def kept(self) -> list[Rollout]:
        return [r for r in self.rollouts if not r.error]

    def tokens_per_s(self) -> float:
        received = sum(self.start <= t < self.end for r in self.kept() for t in r.arrivals)
        return received / (self.end - self.start)

    def discarded(self) -> int:
        return sum(len(r.tokens) for r in self.rollouts if r.error)

    def pauses(self) -> list[float]:
        return [p for _, progress in self.updates for p in progress["pauses_s"]]

    def straddling(self) -> int:
        """Kept rollouts whose tokens came from more than one policy version."""
        return sum(len(r.runs) > 1 for r in self.kept())

    def rollout_s(self) -> float:
        """Mean time from a kept rollout's first token to its last."""
        return statistics.mean(r.arrivals[-1] - r.arrivals[0] for r in self.kept() if r.arrivals)


async def rollout(http: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int, seed: int) -> Rollout:
    body = {"model": "tiny-qwen2", "prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0, "seed": seed,
            "ignore_eos": True, "stream": True, "return_token_ids": True, "logprobs": 0, "stream_interval": 8}
    seen = Rollout(prompt)
    try:
        async with http.stream("POST", f"{url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                seen.error = f"HTTP {response.status_code}"
                return seen
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    seen.error = chunk["error"]["message"]
                    continue
                now = time.perf_counter()
                for choice in chunk["choices"]:
                    ids = choice.get("token_ids") or []
                    seen.tokens += ids
                    seen.arrivals += [now] * len(ids)
                    seen.logprobs += (choice.get("logprobs") or {}).get("token_logprobs") or []
                    for run in choice.get("policy_versions") or []:
                        if not seen.runs or seen.runs[-1]["version"] != run["version"]:
                            seen.runs.append(run)
    except httpx.HTTPError as exc:
        seen.error = repr(exc)
    return seen


async def run_phase(url: str, mode: str, update, first_version: int, args) -> Phase:
    """`update(version)`: asks for one update (returns the deployer's record of it)."""
    phase, stop = Phase(mode), asyncio.Event()
    rng = random.Random(mode)

    async def client(k: int):
        async with httpx.AsyncClient(timeout=600) as http:
            while not stop.is_set():
                prompt = [rng.randrange(10, 4000) for _ in range(PROMPT_TOKENS)]
                phase.rollouts.append(await rollout(http, url, prompt, args.max_tokens, rng.randrange(2**31)))

    clients = [asyncio.create_task(client(k)) for k in range(args.clients)]
    await asyncio.sleep(args.warmup_s)
    phase.start = time.perf_counter()
    for i in range(args.updates):
        await asyncio.sleep(args.update_every_s)
        asked = time.perf_counter()
        progress = await update(first_version + i)
        phase.updates.append((asked, progress))
        print(f"  {mode}: version {first_version + i} after {time.perf_counter() - asked:.2f} s "
              f"(pause {progress['pauses_s']})", flush=True)
    await asyncio.sleep(args.update_every_s)
    phase.end = time.perf_counter()
    stop.set()
    await asyncio.gather(*clients)
    return phase


async def disk_update(url: str, mode: str, checkpoints: list[Path], version: int) -> dict:
    """An update from a checkpoint on disk (two alternate), through POST /v1/rl/update_weights."""
    async with httpx.AsyncClient(timeout=600) as http:
        response = await http.post(f"{url}/v1/rl/update_weights", json={
            "version": version, "target": {"kind": "base"}, "in_flight": mode,
            "transport": {"filesystem": {"path": str(checkpoints[version % 2])}}})
    if response.status_code != 200:
        raise SystemExit(f"update failed: {response.status_code} {response.text}")
    return response.json()


class Pusher:
    """The trainer of the transfer phase: a transformers model that takes the two checkpoints' weights in turn
    and pushes them (finetune_deploy/trainer_client.py, gloo), as a trainer pushes after each step."""

    def __init__(self, url: str, checkpoints: list[Path]):
        from safetensors.torch import load_file
        from transformers import AutoModelForCausalLM

        from finetune_deploy.trainer_client import WeightPusher

        self.model = AutoModelForCausalLM.from_pretrained(checkpoints[0], dtype=torch.float32)
        self.weights = [load_file(c / "model.safetensors") for c in checkpoints]
        self.pusher = WeightPusher.connect(url, self.model)
        self.rounds_s: list[float] = []  # each push as the trainer saw it: start -> finish answered

    async def push(self, version: int) -> dict:
        self.model.load_state_dict(self.weights[version % 2], strict=False)
        progress = await asyncio.to_thread(self.pusher.push, version)
        self.rounds_s.append(progress["push_s"])
        return progress


def checked_tokens(phase: Phase, version_dirs: dict[int, Path], limit: int) -> tuple[int, int]:
    """(tokens checked, tokens whose logprob is not the stamped weights') around the keep phase's boundaries."""
    from transformers import AutoModelForCausalLM

    models = {v: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32) for v, d in version_dirs.items()}
    straddling = [r for r in phase.kept() if len(r.runs) > 1 and r.logprobs][:limit]
    checked = mismatched = 0
    with torch.no_grad():
        for r in straddling:
            boundary = r.runs[1]["first_token_index"]
            old, new = models[r.runs[0]["version"]], models[r.runs[1]["version"]]
            ids = r.prompt + r.tokens
            first = len(r.prompt) + max(0, boundary - CHECKED_BEFORE)
            last = len(r.prompt) + min(len(r.tokens), boundary + CHECKED_AFTER)
            kept_kv = len(r.prompt) + boundary - 1  # the last old token's KV is computed after the resume
            before = torch.log_softmax(old(torch.tensor([ids[:last]])).logits[0].float(), -1)
            past = old(torch.tensor([ids[:kept_kv]]), use_cache=True).past_key_values
            after = torch.log_softmax(new(torch.tensor([ids[kept_kv:last]]), past_key_values=past).logits[0], -1)
            for position in range(first, last):  # the token at `position` was sampled from logits[position - 1]
                index = position - len(r.prompt)
                if index < boundary:
                    reference = before[position - 1, ids[position]]
                else:
                    reference = after[position - 1 - kept_kv, ids[position]]
                checked += 1
                mismatched += abs(float(reference) - r.logprobs[index]) > LOGPROB_TOLERANCE
    return checked, mismatched


def figure(phases: list[Phase], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    fig, ax = pyplot.subplots(figsize=(9, 4))
    for phase in phases:
        arrivals = sorted(t - phase.start for r in phase.kept() for t in r.arrivals
                          if phase.start <= t < phase.end)
        seconds = int(phase.end - phase.start)
        counts = [0] * seconds
        for t in arrivals:
            counts[min(int(t), seconds - 1)] += 1
        label = "in_flight=keep, pushed (gloo)" if phase.mode == TRANSFER else f"in_flight={phase.mode}"
        line, = ax.plot(range(seconds), counts, label=label)
        for asked, _ in phase.updates:
            ax.axvline(asked - phase.start, color=line.get_color(), alpha=0.3, linestyle="--")
    ax.set_xlabel("seconds (dashed: a weight update asked for)")
    ax.set_ylabel("rollout tokens/s (kept)")
    ax.set_title("Weight updates under a continuous rollout load (tiny model, 2-core CPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


async def run(url: str, work: Path, args) -> tuple[dict, list[Phase]]:
    sources = [ensure_tiny_model(1, CACHE_DIR / "models"), ensure_tiny_model(0, CACHE_DIR / "models")]
    checkpoints = [copy_checkpoint(source, work / f"step-{i}") for i, source in enumerate(sources)]
    phases, version = [], 10
    pusher = await asyncio.to_thread(Pusher, url, checkpoints)
    for mode in (*MODES, TRANSFER):
        print(f"phase {mode}: {args.clients} clients x {args.max_tokens} tokens, an update every "
              f"{args.update_every_s:g} s", flush=True)
        if mode == TRANSFER:
            update = pusher.push
        else:
            update = functools.partial(disk_update, url, mode, checkpoints)
        phases.append(await run_phase(url, mode, update, version, args))
        version += args.updates
    checked = mismatched = 0
    for phase in phases[-2:]:  # keep (from disk) and keep (transfer): the same rules
        versions = {run["version"] for r in phase.kept() for run in r.runs}
        counts = checked_tokens(phase, {v: checkpoints[v % 2] for v in versions}, args.checked_rollouts)
        checked, mismatched = checked + counts[0], mismatched + counts[1]
    by_mode = {p.mode: p for p in phases}
    results = {
        "rollout_tokens_per_s_keep_over_finish": round(by_mode["keep"].tokens_per_s()
                                                       / by_mode["finish"].tokens_per_s(), 3),
        "rollout_tokens_per_s_keep_over_abort": round(by_mode["keep"].tokens_per_s()
                                                      / by_mode["abort"].tokens_per_s(), 3),
        "tokens_discarded_abort": by_mode["abort"].discarded(),
        "tokens_discarded_keep": by_mode["keep"].discarded(),
        "tokens_discarded_finish": by_mode["finish"].discarded(),
        "update_pause_s_disk_p50": round(statistics.median(by_mode["keep"].pauses()), 4),
        "update_pause_s_transfer_p50": round(statistics.median(by_mode[TRANSFER].pauses()), 4),
        "update_s_transfer_p50": round(statistics.median(pusher.rounds_s), 4),
        "tokens_discarded_transfer": by_mode[TRANSFER].discarded(),
        "update_pause_s_finish_p50": round(statistics.median(by_mode["finish"].pauses()), 4),
        "version_mismatched_tokens": mismatched,
        "version_checked_tokens": checked,
    }
    results["rollout_tokens_per_s_transfer_over_disk"] = round(by_mode[TRANSFER].tokens_per_s()
                                                               / by_mode["keep"].tokens_per_s(), 3)
    for phase in phases:
        results[f"rollout_tokens_per_s_{phase.mode}"] = round(phase.tokens_per_s(), 1)
        results[f"straddling_rollouts_{phase.mode}"] = phase.straddling()
        results[f"rollout_s_mean_{phase.mode}"] = round(phase.rollout_s(), 2)
    results.update(clients=args.clients, max_tokens=args.max_tokens, update_every_s=args.update_every_s,
                   updates_per_mode=args.updates, workers=1)
    return results, phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=32, help="concurrent rollouts")
    parser.add_argument("--max-tokens", type=int, default=1024, help="tokens per rollout")
    parser.add_argument("--update-every-s", type=float, default=20.0)
    parser.add_argument("--updates", type=int, default=3, help="updates per mode")
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--checked-rollouts", type=int, default=16,
                        help="keep-mode rollouts straddling an update whose logprobs are checked with transformers")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rl-sync-bench-") as tmp:
        stack = start_stack(Path(tmp) / "stack", workers=1, extra_args=["--dtype", "float32"],
                            extra_env={"ROLLOUT_SERVE_TRACES__ENABLED": "false"})
        try:
            results, phases = asyncio.run(run(stack.url, Path(tmp), args))
        finally:
            stack.stop()
    for phase in phases:
        print(f"{phase.mode:>6}: {phase.tokens_per_s():7.1f} rollout tok/s, {phase.discarded():6d} tokens discarded, "
              f"pauses {[round(p, 3) for p in phase.pauses()]}, rollouts {phase.rollout_s():.1f} s on average, "
              f"{phase.straddling()} across two versions")
    print(f"keep / finish: {results['rollout_tokens_per_s_keep_over_finish']:.3f} (goal >= 1.5); "
          f"keep / abort: {results['rollout_tokens_per_s_keep_over_abort']:.3f}; pause p50 from disk "
          f"{results['update_pause_s_disk_p50']} s, pushed {results['update_pause_s_transfer_p50']} s (goal <= 0.5)")
    print(f"version-mismatched tokens: {results['version_mismatched_tokens']} of {results['version_checked_tokens']} "
          "checked (goal 0)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    figure(phases, FIGURE)
    print(f"wrote {RESULTS} and {FIGURE}")


if __name__ == "__main__":
    main()
