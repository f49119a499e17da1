"""Asynchronous against synchronous RL on the same task and budget: examples/async_rl.py's loop, both ways.

Each mode runs on a fresh stack (one float32 worker, the base weights): sync generates a batch, trains, pushes
the weights, then generates the next; async generates the next batch while a step trains and pushes (one batch
ahead, `max_policy_lag` 1, weights pushed in keep mode). Both stop after `--steps` steps or `--minutes`.
The target reward is the two runs' mean starting reward (their first batches, sampled with the base weights)
plus `--rise`; a run reaches it when its 3-step mean reward does.

Run: .venv/bin/python benchmarks/async_rl.py   (about 6 minutes on 2 cores)
Writes benchmarks/results/async_rl.json and benchmarks/results/async_rl.png (reward and version over time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.async_rl import History, add_loop_arguments, figure, run_loop  # noqa: E402
from rollout_server.harness.stack import start_stack  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "async_rl.json"


def run_mode(mode: str, args) -> History:
    with tempfile.TemporaryDirectory(prefix=f"async-rl-bench-{mode}-") as tmp:
        stack = start_stack(Path(tmp) / "stack", workers=1, extra_args=["--dtype", "float32"])
        try:
            return run_loop(stack.url, mode, args)
        finally:
            stack.stop()


def tokens_per_s(history: History) -> float:
    return sum(s.tokens for s in history.steps) / history.steps[-1].seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_loop_arguments(parser)
    parser.add_argument("--rise", type=float, default=0.5, help="target: the starting reward plus this")
    parser.set_defaults(steps=60, minutes=5.0)
    args = parser.parse_args()
    histories = {mode: run_mode(mode, args) for mode in ("sync", "async")}
    sync, asynchronous = histories["sync"], histories["async"]
    target = statistics.mean(h.start_reward() for h in histories.values()) + args.rise
    reached = {mode: h.seconds_to(target) for mode, h in histories.items()}
    async_tokens = sum(s.tokens for s in asynchronous.steps)
    results = {
        "time_to_reward_sync_over_async": (round(reached["sync"] / reached["async"], 3)
                                           if None not in reached.values() else None),
        "rollout_tokens_per_s_async_over_sync": round(tokens_per_s(asynchronous) / tokens_per_s(sync), 3),
        "final_reward_sync": round(statistics.mean(s.reward for s in sync.steps[-3:]), 3),
        "final_reward_async": round(statistics.mean(s.reward for s in asynchronous.steps[-3:]), 3),
        "off_policy_token_fraction_async": round(sum(s.off_policy_tokens for s in asynchronous.steps)
                                                 / async_tokens, 4),
        "target_reward": round(target, 3),
    }
    for mode, history in histories.items():
        results.update({
            f"seconds_to_target_{mode}": None if reached[mode] is None else round(reached[mode], 1),
            f"start_reward_{mode}": round(history.start_reward(), 3),
            f"steps_{mode}": len(history.steps),
            f"seconds_per_step_{mode}": round(history.steps[-1].seconds / len(history.steps), 2),
            f"rollout_tokens_per_s_{mode}": round(tokens_per_s(history), 1),
            f"rollouts_lost_{mode}": len(history.lost),
            # where a step's time goes, as the trainer sees it (means over the steps after the first)
            f"waited_s_mean_{mode}": round(statistics.mean(s.waited_s for s in history.steps[1:]), 3),
            f"trained_s_mean_{mode}": round(statistics.mean(s.trained_s for s in history.steps[1:]), 3),
            f"pushed_s_mean_{mode}": round(statistics.mean(s.pushed_s for s in history.steps[1:]), 3),
        })
    results.update(groups_per_step=args.groups, samples_per_group=args.samples, max_tokens=args.max_tokens,
                   lr=args.lr, seed=args.seed, workers=1)
    for mode, history in histories.items():
        print(f"{mode:>5}: target {target:.3f} reached after {reached[mode]} s; {len(history.steps)} steps, "
              f"{results[f'seconds_per_step_{mode}']} s each, {results[f'rollout_tokens_per_s_{mode}']} rollout "
              f"tok/s, final reward {results[f'final_reward_{mode}']}")
    print(f"time to reward sync/async: {results['time_to_reward_sync_over_async']} (goal >= 1.5); rollout tokens/s "
          f"async/sync: {results['rollout_tokens_per_s_async_over_sync']}; off-policy tokens (async): "
          f"{results['off_policy_token_fraction_async']:.1%}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    figure([sync, asynchronous], RESULTS.with_suffix(".png"))
    print(f"wrote {RESULTS} and {RESULTS.with_suffix('.png')}")


if __name__ == "__main__":
    main()
