"""The host-DRAM KV tier measured full: the tokens it holds, returning-turn hits, what NVFP4 does to answers.

Every figure comes from a real stack through the front door: one vLLM worker (bfloat16, a KV cache of
WORKER_CACHE_BLOCKS blocks, so that prompts leave it and their blocks live on in the tier only) with the
tier's connector, mooncake_master and the segment holder. One stack stores NVFP4 blocks, the other
lossless ones (the cache dtype, bfloat16); both tiers have the same capacity. On each stack, in order:

1. Greedy answers (`greedy_agreement`): a fixed set of chat prompts (rendered conversations with tools, as the
   tiny model was trained on) served once cold (recomputed, then saved to the tier), then again once the
   worker's cache has evicted them, so that their prefix comes back from the tier; temperature 0, up to 32
   tokens, as served (stopping at EOS). Agreement = tokens equal position by position over the longer of the
   two answers. Only prompts whose whole loadable prefix was read from the tier count (the master's object
   reads and the answer's cached tokens say so). On the lossless stack this is the control: it must be 1.0.
2. Fill (`fill_tier`): distinct long prompts until Mooncake evicts. Mooncake evicts 5% of its objects once
   90% of the capacity is allocated (mooncake_master's eviction_high_watermark_ratio and eviction_ratio), so
   a full tier holds 85-90% of its capacity, in a sawtooth. Tokens held = objects in the tier (the master's
   `master_key_count`: one object per 32-token block) x 32, averaged over samples taken after each fill
   request once the tier is full, each once the request's save is in and Mooncake's eviction has brought the
   tier back under its high watermark (a sample taken between a save and the eviction it triggers would favour
   the format with the larger saves), until a quarter of what it holds has turned over.
3. Returning turns (benchmarks/agentic.py's `returning_turns`: sessions interleaved turn by turn) with more
   session tokens than the lossless tier holds and fewer than the NVFP4 one does: the share of returning
   turns' prompt tokens served cached (usage.prompt_tokens_details.cached_tokens) and their p50 TTFT.

Run alone: .venv/bin/python benchmarks/kv_tier_fill.py [--quick]   (prints the figures; writes no results file:
benchmarks/agentic.py calls `measure` and merges them into agentic.json)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.kv_tier.formats import KvShape, tier_capacity_tokens
from engine.kv_tier.settings import KvTierSettings
from engine.supervisor import kv_tier_service
from rollout_server.harness.stack import CACHE_DIR, RunningStack, free_port_block, start_stack
from rollout_server.tiny_model.builder import ensure_tiny_model

BLOCK = 32                 # tokens per KV block, one tier object per block
WORKER_CACHE_BLOCKS = 160  # the worker's whole KV cache: 5,120 tokens, 10 MiB in bfloat16
WORKER_CACHE_GIB = WORKER_CACHE_BLOCKS * BLOCK * 2048 / 2**30  # tiny model, bf16: 2 KiB of KV per token
MAX_MODEL_LEN = 4096
FILL_PROMPT_TOKENS = 1500  # 47 blocks: one save is 9% of a 32 MiB tier lossless, within what one eviction frees
HIGH_WATERMARK = 0.9       # mooncake_master's eviction_high_watermark_ratio (its default, as the stack starts it)
TURNOVER = 0.25            # the fill goes on until this share of the objects held has been evicted ...
FULL_SAMPLES = 4           # ... and the full tier has been sampled this many times
ANSWER_TOKENS = 32


@dataclass(frozen=True)
class Plan:
    """The sizes of one run. Session tokens (sessions x final prompt) must exceed what the lossless tier holds and
    fit the NVFP4 one: 32 MiB holds ~14k tokens lossless, ~46k in NVFP4 (85-90% of 512 / 1,638 slots of 32 tokens)."""

    tier_gib: float = 1 / 32   # 32 MiB
    sessions: int = 12
    turns: int = 3
    session_tokens: int = 2000
    agreement_prompts: int = 12


QUICK = Plan(tier_gib=1 / 64, sessions=8, turns=2, session_tokens=1500, agreement_prompts=4)


@dataclass
class Answer:
    token_ids: list[int]
    cached_tokens: int
    objects_read: int  # tier objects the master handed out while it was served (nothing else runs meanwhile)


class TierStack:
    """A running one-worker stack with the tier in one format; its front door and its tier's master metrics."""

    def __init__(self, tmp: Path, nvfp4: bool, tier_gib: float, port_start: int = 32400):
        self.nvfp4 = nvfp4
        self.name = "nvfp4" if nvfp4 else "lossless"
        self.tier = KvTierSettings(enabled=True, capacity_gib=tier_gib, nvfp4=nvfp4,
                                   port_base=free_port_block(3, start=port_start))
        self.stack: RunningStack = start_stack(
            tmp / f"tier-{self.name}", workers=1, timeout_s=900,
            extra_args=["--kv-cache-gib", repr(WORKER_CACHE_GIB), "--max-model-len", str(MAX_MODEL_LEN),
                        "--dtype", "bfloat16"],
            extra_env={"ROLLOUT_SERVE_TRACES__ENABLED": "false", **self.tier.as_env()})

    def metrics(self) -> kv_tier_service.TierMetrics:
        metrics = kv_tier_service.read_metrics(self.tier)
        if metrics is None:
            raise RuntimeError(f"the {self.name} tier's master does not answer\n{self.stack.log_tail()}")
        return metrics

    def complete(self, prompt: list[int], max_tokens: int, cache_salt: str | None = None) -> Answer:
        before = self.metrics().get_requests
        response = httpx.post(f"{self.stack.url}/v1/completions", timeout=300, json={
            "model": self.stack.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, **({"cache_salt": cache_salt} if cache_salt else {})})
        response.raise_for_status()
        body = response.json()
        cached = (body["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return Answer(body["choices"][0]["token_ids"], cached, self.metrics().get_requests - before)

    def stop(self) -> None:
        self.stack.stop()


def random_prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(300, 4000) for _ in range(length)]


# ---- 1. greedy answers with the prefix from the tier vs recomputed ------------------------------

def chat_prompts(model_dir: Path, count: int) -> list[list[int]]:
    """Conversations like those the tiny model was trained on (tools declared, calls, results), cut before the
    last assistant turn and rendered with its chat template: 256 to 1,024 tokens each (8 to 31 blocks)."""
    from transformers import AutoTokenizer

    from rollout_server.tiny_model.training import random_conversation

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rng, prompts = random.Random(43), []
    while len(prompts) < count:
        conversation = random_conversation(rng, max_tools=8)
        ids = tokenizer.apply_chat_template(conversation.messages[:-1], tools=conversation.tools,
                                            add_generation_prompt=True, tokenize=False)
        ids = tokenizer(ids, add_special_tokens=False)["input_ids"]
        if 256 <= len(ids) <= 1024:
            prompts.append(ids)
    return prompts


def greedy_agreement(ts: TierStack, prompts: list[list[int]]) -> dict:
    """Each prompt answered cold, then with its prefix loaded from the tier; tokens agreeing position by position.

    Each prompt has a cache salt of its own: the prompts share their chat template's first blocks, and a cold
    answer must not read another prompt's blocks (from the worker's cache or the tier)."""
    salts = [f"agreement-{i}" for i in range(len(prompts))]
    cold = [ts.complete(p, ANSWER_TOKENS, salt) for p, salt in zip(prompts, salts)]
    # The prompts and a filler cycle the worker's cache: served again in the same order, each one's blocks were
    # evicted (least recently used first) by those served after it.
    filler = (WORKER_CACHE_BLOCKS + 32) * BLOCK - sum(map(len, prompts))
    if filler > 0:
        ts.complete(random_prompt(seed=1, length=min(filler, MAX_MODEL_LEN - 1)), 1)
    agreeing = compared = identical = from_tier = 0
    for prompt, salt, first in zip(prompts, salts, cold):
        again = ts.complete(prompt, ANSWER_TOKENS, salt)
        loadable = (len(prompt) - 1) // BLOCK  # vLLM always computes a prompt's last token
        if first.cached_tokens or again.objects_read != loadable or again.cached_tokens != loadable * BLOCK:
            continue  # not a cold answer against a whole prefix from the tier
        from_tier += 1
        positions = max(len(first.token_ids), len(again.token_ids))
        agreeing += sum(a == b for a, b in zip(first.token_ids, again.token_ids))
        compared += positions
        identical += first.token_ids == again.token_ids
    return {"greedy_agreement": agreeing / compared if compared else float("nan"),
            "identical_responses": identical / from_tier if from_tier else float("nan"),
            "agreement_prompts": from_tier, "agreement_tokens_compared": compared}


# ---- 2. the tier filled ----------------------------------------------------------------------

def fill_tier(ts: TierStack, first_seed: int = 1000, max_prompts: int | None = None) -> dict:
    """Distinct long prompts until the tier has evicted a quarter of what it holds; the objects it holds
    (each a BLOCK-token block) sampled after each prompt from then on."""
    shape = KvShape.from_hf_config(ensure_tiny_model(0, CACHE_DIR / "models"))
    if max_prompts is None:  # a bound, not the stopping rule: twice what the NVFP4 tier could take
        max_prompts = 2 * tier_capacity_tokens(ts.tier.capacity_bytes, shape, BLOCK, "nvfp4") // FILL_PROMPT_TOKENS
    started, samples = time.monotonic(), []
    for seed in range(first_seed, first_seed + max_prompts):
        before = ts.metrics()
        ts.complete(random_prompt(seed, FILL_PROMPT_TOKENS), 1)
        metrics = settled(ts, before)
        if metrics.evicted_keys:  # Mooncake evicts past its high watermark: the tier is full
            samples.append(metrics)
        if len(samples) >= FULL_SAMPLES and metrics.evicted_keys >= TURNOVER * metrics.keys:
            break
    else:
        raise RuntimeError(f"the {ts.name} tier never filled with {max_prompts} prompts: {ts.metrics()}")
    last = samples[-1]
    return {"tokens_held": round(statistics.mean(m.keys for m in samples) * BLOCK),
            "tokens_held_min": min(m.keys for m in samples) * BLOCK,
            "tokens_held_max": max(m.keys for m in samples) * BLOCK,
            "fill_fraction": statistics.mean(m.allocated_bytes for m in samples) / last.capacity_bytes,
            "capacity_bytes": last.capacity_bytes, "fill_prompts": seed - first_seed + 1,
            "objects_evicted": last.evicted_keys, "puts_refused": last.put_failures,
            "fill_s": time.monotonic() - started}


def settled(ts: TierStack, before: kv_tier_service.TierMetrics, timeout_s: float = 5.0) -> kv_tier_service.TierMetrics:
    """The tier's metrics once the save of the request served since `before` is in (it runs in the engine step
    after the request finished) and the tier is under its high watermark (Mooncake evicts in the background)."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = ts.metrics()
        saved = (metrics.keys, metrics.evicted_keys, metrics.put_failures) != (
            before.keys, before.evicted_keys, before.put_failures)
        if saved and metrics.allocated_bytes <= HIGH_WATERMARK * metrics.capacity_bytes:
            return metrics
        if time.monotonic() > deadline:
            raise RuntimeError(f"the {ts.name} tier did not settle in {timeout_s:.0f} s: {metrics}")
        time.sleep(0.05)


# ---- 3. returning turns ----------------------------------------------------------------------

def returning(ts: TierStack, plan: Plan) -> dict:
    from benchmarks import agentic  # imported here: agentic.py imports this module

    workload = agentic.TierWorkload(sessions=plan.sessions, turns=plan.turns, first_tokens=plan.session_tokens)
    turns = asyncio.run(agentic.returning_turns(ts.stack.url, workload))
    errors = [t.error for t in turns if t.error]
    if errors:
        raise RuntimeError(f"{len(errors)} returning-turn requests failed on the {ts.name} tier: {errors[0]}")
    back = [t for t in turns if t.kind == "warm-returning"]
    return {"hit_rate": sum(t.cached_tokens for t in back) / sum(t.prompt_tokens for t in back),
            "ttft_s": agentic.percentile([t.ttft for t in back], 0.5),
            "session_tokens": sum(t.prompt_tokens for t in turns[-plan.sessions:])}


# ---- both formats ----------------------------------------------------------------------------

def measure(tmp: Path, quick: bool = False) -> dict:
    plan = QUICK if quick else Plan()
    prompts = chat_prompts(ensure_tiny_model(0, CACHE_DIR / "models"), plan.agreement_prompts)
    runs: dict[str, dict] = {}
    for nvfp4 in (True, False):
        ts = TierStack(tmp, nvfp4, plan.tier_gib)
        try:
            print(f"   [tier {ts.name}] {plan.tier_gib * 1024:g} MiB tier, {WORKER_CACHE_BLOCKS}-block worker cache",
                  flush=True)
            run = {**greedy_agreement(ts, prompts), **fill_tier(ts)}
            run.update({f"returning_{k}": v for k, v in returning(ts, plan).items()})
        finally:
            ts.stop()
        print(f"   [tier {ts.name}] full: {run['tokens_held']:,} tokens held ({run['fill_fraction']:.0%} allocated, "
              f"{run['fill_prompts']} prompts, {run['puts_refused']} puts refused); returning turns: hit rate "
              f"{run['returning_hit_rate']:.1%}, p50 TTFT {run['returning_ttft_s']:.3f} s; greedy agreement "
              f"{run['greedy_agreement']:.3f} over {run['agreement_prompts']} prompts", flush=True)
        runs[ts.name] = run
    nv, lossless = runs["nvfp4"], runs["lossless"]
    return {
        "tier_tokens_held_nvfp4_over_lossless": nv["tokens_held"] / lossless["tokens_held"],
        "tier_fill_capacity_bytes": nv["capacity_bytes"],
        "tier_tokens_held_nvfp4": nv["tokens_held"], "tier_tokens_held_lossless": lossless["tokens_held"],
        "tier_fill_fraction_nvfp4": nv["fill_fraction"], "tier_fill_fraction_lossless": lossless["fill_fraction"],
        "tier_puts_refused_nvfp4": nv["puts_refused"], "tier_puts_refused_lossless": lossless["puts_refused"],
        "returning_hit_rate_nvfp4_tier": nv["returning_hit_rate"],
        "returning_hit_rate_lossless_tier": lossless["returning_hit_rate"],
        "returning_ttft_s_nvfp4_tier": nv["returning_ttft_s"],
        "returning_ttft_s_lossless_tier": lossless["returning_ttft_s"],
        "returning_session_tokens": nv["returning_session_tokens"],
        "nvfp4_greedy_agreement": nv["greedy_agreement"],
        "nvfp4_identical_responses": nv["identical_responses"],
        "nvfp4_agreement_prompts": nv["agreement_prompts"],
        "nvfp4_agreement_tokens_compared": nv["agreement_tokens_compared"],
        "lossless_greedy_agreement": lossless["greedy_agreement"],
        "lossless_agreement_prompts": lossless["agreement_prompts"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smaller tier and fewer sessions and prompts")
    opts = parser.parse_args()
    started = time.monotonic()
    figures = measure(Path(tempfile.mkdtemp(prefix="kv-tier-fill-")), opts.quick)
    print(json.dumps(figures, indent=2))
    print(f"   ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
