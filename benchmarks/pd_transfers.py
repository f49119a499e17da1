"""KV transfers between prefill and decode workers: vLLM's layer-major layout (LBHNC) against block-major (BLHNC).

Each stack is 1 prefill + 1 decode worker (every prompt prefilled remotely), started once per layout and model:
the tiny model (4 layers) and a model of production-like depth (61 layers, as DeepSeek-V3; the tiny model's
other dimensions, untrained: transfers do not depend on the weights). Cold prompts are sent one at a time,
and after each one the decode worker's NIXL telemetry (vLLM's `vllm:nixl_*` histograms on its /metrics: NIXL's
own per-transfer descriptor count and duration, post to completion) gives that request's descriptors and
transfer time. The greedy tokens of both layouts are compared prompt by prompt.

Run alone: .venv/bin/python benchmarks/pd_transfers.py [--quick]   (prints the figures; about 6 minutes)
benchmarks/agentic.py runs it and writes its figures into benchmarks/results/agentic.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.supervisor.health import vllm_counter  # noqa: E402
from rollout_server.harness.stack import CACHE_DIR, free_port_block, start_stack  # noqa: E402
from rollout_server.tiny_model.builder import TinyModelShape, build_tiny_model, ensure_tiny_model  # noqa: E402
from rollout_server.tiny_model.training import TrainingRecipe  # noqa: E402

PRODUCTION_LAYERS = 61
LAYOUTS = ("LBHNC", "BLHNC")  # vLLM's default first: the baseline
NIXL = {"transfers": "vllm:nixl_xfer_time_seconds_count", "seconds": "vllm:nixl_xfer_time_seconds_sum",
        "descriptors": "vllm:nixl_num_descriptors_sum", "bytes": "vllm:nixl_bytes_transferred_sum"}


@dataclass(frozen=True)
class Load:
    prompts: int = 12              # measured prompts per phase
    prompt_tokens: int = 2048
    out_tokens: int = 8
    pool_tokens: int = 16384       # each worker's KV cache (bf16), so that the churn cycles through it
    churn_prompts: int = 40        # 40 x ~1,200 tokens, 8 at a time: ~3 pools' worth of interleaved allocations
    churn_concurrency: int = 8


@dataclass
class RequestTransfer:
    tokens: list[int]
    transfers: int
    seconds: float
    descriptors: int
    bytes: int


def deep_model() -> Path:
    """The tiny model at production depth, untrained (built in seconds, cached)."""
    target = CACHE_DIR / "models" / f"tiny-qwen2-{PRODUCTION_LAYERS}-layers"
    if not (target / "config.json").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        build_tiny_model(target, shape=TinyModelShape(num_hidden_layers=PRODUCTION_LAYERS),
                         training=TrainingRecipe(steps=0, warmup_steps=0))
    return target


def nixl_totals(port: int) -> dict[str, float]:
    return {key: vllm_counter(port, name) for key, name in NIXL.items()}


def serve_one(url: str, port: int, prompt: list[int], out_tokens: int) -> RequestTransfer:
    """One cold prompt, and its transfer as the decode worker's NIXL telemetry counts it."""
    before = nixl_totals(port)
    resp = httpx.post(f"{url}/v1/completions", timeout=600,
                      json={"model": "model", "prompt": prompt, "max_tokens": out_tokens, "temperature": 0.0,
                            "ignore_eos": True, "return_token_ids": True})
    resp.raise_for_status()
    deadline = time.monotonic() + 30  # the telemetry reaches /metrics with the engine's next stats update
    while (after := nixl_totals(port))["transfers"] == before["transfers"] and time.monotonic() < deadline:
        time.sleep(0.2)
    delta = {key: after[key] - before[key] for key in after}
    return RequestTransfer(resp.json()["choices"][0]["token_ids"], int(delta["transfers"]), delta["seconds"],
                           int(delta["descriptors"]), int(delta["bytes"]))


def churn(url: str, load: Load, rng: random.Random) -> None:
    """Concurrent prompts of random lengths through the same workers: their blocks interleave when allocated and
    return to vLLM's free queue so, as in a worker that has served for a while."""
    prompts = [[rng.randrange(300, 4000) for _ in range(rng.randrange(256, 2048))] for _ in range(load.churn_prompts)]

    def send(prompt: list[int]) -> None:
        httpx.post(f"{url}/v1/completions", timeout=600, json={
            "model": "model", "prompt": prompt, "max_tokens": 4, "temperature": 0.0}).raise_for_status()

    with ThreadPoolExecutor(load.churn_concurrency) as threads:
        list(threads.map(send, prompts))


def kv_bytes_per_token(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    return config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * 2  # K and V, bf16


def run_layout(tmp: Path, model_dir: Path, layout: str, load: Load) -> dict[str, list[RequestTransfer]]:
    """Per phase ("fresh": a new worker's pool, whose blocks come in order; "churned": after `churn`), the
    measured requests' transfers."""
    print(f"   [{model_dir.name}, {layout}] starting", flush=True)
    kv_gib = load.pool_tokens * kv_bytes_per_token(model_dir) / 2**30
    stack = start_stack(tmp / f"{model_dir.name}-{layout}", workers=2, timeout_s=900, extra_args=[
        "--model", str(model_dir), "--served-model-name", "model", "--max-model-len", "8192",
        "--kv-cache-gib", f"{kv_gib:.4f}",
        "--prefill-workers", "1", "--decode-workers", "1", "--disagg-local-max-uncached-tokens", "0",
        "--nixl-side-channel-base-port", str(free_port_block(2, start=31500))],
        extra_env={"ROLLOUT_SERVE_TRACES__ENABLED": "false", "ROLLOUT_SERVE_ENGINE__DISAGGREGATION__KV_LAYOUT": layout})
    try:
        port = stack.worker_system_port(1)
        rng = random.Random(43)  # the same prompts for both layouts
        prompts = [[rng.randrange(300, 4000) for _ in range(load.prompt_tokens)] for _ in range(2 * load.prompts + 1)]
        serve_one(stack.url, port, prompts[0], load.out_tokens)  # the first transfer pays NIXL's handshake
        phases = {"fresh": [serve_one(stack.url, port, p, load.out_tokens) for p in prompts[1:load.prompts + 1]]}
        churn(stack.url, load, rng)
        phases["churned"] = [serve_one(stack.url, port, p, load.out_tokens) for p in prompts[load.prompts + 1:]]
    finally:
        stack.stop()
    for phase, requests in phases.items():
        print(f"   [{model_dir.name}, {layout}, {phase}] descriptors per request {[r.descriptors for r in requests]}, "
              f"transfer ms {[round(r.seconds * 1e3, 2) for r in requests]}", flush=True)
    return phases


def measure(tmp: Path, quick: bool = False) -> dict:
    load = replace(Load(), prompts=4, churn_prompts=16) if quick else Load()
    models = {"tiny": ensure_tiny_model(0, CACHE_DIR / "models"), "deep": deep_model()}
    fig: dict = {"pd_prompt_tokens": load.prompt_tokens, "pd_requests_per_phase": load.prompts,
                 "pd_pool_tokens": load.pool_tokens, "pd_churn_prompts": load.churn_prompts,
                 "pd_deep_layers": PRODUCTION_LAYERS,
                 "pd_tiny_layers": json.loads((models["tiny"] / "config.json").read_text())["num_hidden_layers"]}
    for name, model_dir in models.items():
        runs = {layout: run_layout(tmp, model_dir, layout, load) for layout in LAYOUTS}
        for phase in ("fresh", "churned"):
            for layout, phases in runs.items():
                requests, key = phases[phase], f"pd_{name}_{phase}_{layout.lower()}"
                fig[f"{key}_descriptors_p50"] = statistics.median(r.descriptors for r in requests)
                fig[f"{key}_transfer_ms_p50"] = statistics.median(r.seconds * 1e3 for r in requests)
                fig[f"{key}_transfer_ms_each"] = [round(r.seconds * 1e3, 3) for r in requests]
                fig[f"{key}_bytes_per_request"] = statistics.median(r.bytes for r in requests)
                fig[f"{key}_transfers_per_request"] = statistics.median(r.transfers for r in requests)
            key = f"pd_{name}_{phase}"
            default, block_major = runs["LBHNC"][phase], runs["BLHNC"][phase]
            fig[f"{key}_greedy_responses_equal"] = sum(a.tokens == b.tokens for a, b in zip(default, block_major))
            fig[f"{key}_descriptors_ratio"] = fig[f"{key}_lbhnc_descriptors_p50"] / fig[f"{key}_blhnc_descriptors_p50"]
            fig[f"{key}_transfer_ms_ratio"] = fig[f"{key}_lbhnc_transfer_ms_p50"] / fig[f"{key}_blhnc_transfer_ms_p50"]
    # The headline figures: production-like depth, a worker that has served a while (its pool churned); the
    # fresh pool's and the tiny model's stand beside them.
    fig["descriptors_per_request_default_over_blhnc"] = fig["pd_deep_churned_descriptors_ratio"]
    fig["kv_transfer_ms_p50_default_over_blhnc"] = fig["pd_deep_churned_transfer_ms_ratio"]
    fig["descriptors_per_request_default_over_blhnc_tiny"] = fig["pd_tiny_churned_descriptors_ratio"]
    fig["kv_transfer_ms_p50_default_over_blhnc_tiny"] = fig["pd_tiny_churned_transfer_ms_ratio"]
    fig["kv_transfer_ms_p50_default_over_blhnc_fresh_pool"] = fig["pd_deep_fresh_transfer_ms_ratio"]
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 measured prompts per phase instead of 12, less churn")
    opts = parser.parse_args()
    fig = measure(Path(tempfile.mkdtemp(prefix="pd-transfers-")), opts.quick)
    print(json.dumps(fig, indent=2))


if __name__ == "__main__":
    main()
