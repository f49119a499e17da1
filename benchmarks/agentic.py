"""Agentic sessions: disaggregated vs aggregated serving, and the host-DRAM KV tier, in one run.

A multi-turn agent workload scaled to a 2-core machine: warm sessions share a long context and each
turn's prompt grows by ~4% (the previous answer plus a tool result); while they decode, cold sessions
arrive with a long uncached document. Everything goes through the rollout-serve front door, streamed.

1. Aggregated (2 workers, cores 0 and 1) vs disaggregated (1 prefill worker on core 0, 1 decode
   worker on core 1, KV over NIXL), same workload, same cores: p90 inter-token latency and TTFT.
   Two more disaggregated runs justify the defaults: conditional disaggregation off (every prompt
   prefilled remotely), and a second prefill token budget (prefill queue time and TTFT).
2. Returning turns with and without the Mooncake host-DRAM tier (engine/kv_tier, `kv_tier.enabled`),
   on one worker whose KV cache is too small to keep every session: prefix hit rate and TTFT.
3. The tier filled: tokens held, returning-turn hit rates and greedy agreement with NVFP4 vs lossless objects
   (benchmarks/kv_tier_fill.py).
4. Prefill-to-decode KV transfers, vLLM's layer-major layout vs block-major (BLHNC): descriptors and transfer
   time per request from NIXL's telemetry (benchmarks/pd_transfers.py).

Run: .venv/bin/python benchmarks/agentic.py   (about 12 minutes on 2 cores; --quick: shorter)
Writes benchmarks/results/agentic.json.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import kv_tier_fill, pd_transfers
from engine.settings import DisaggregationSettings
from engine.supervisor.health import vllm_counter, vllm_quantile
from rollout_server.harness.stack import CACHE_DIR, free_port_block, start_stack
from rollout_server.tiny_model.builder import ensure_tiny_model

RESULTS = Path(__file__).parent / "results" / "agentic.json"
MODEL = "tiny-qwen2"
BLOCK_SIZE = 32


@dataclass(frozen=True)
class Workload:
    shared_tokens: int = 2048      # context every session shares (system prompt, tools, repository map)
    task_tokens: int = 256         # each warm session's own task
    growth: float = 0.04           # a turn adds ~4% to the prompt (answer + tool result)
    out_tokens: int = 48           # tokens generated per turn
    warm_sessions: int = 4
    turns_per_session: int = 30    # the prompt grows 1.04^30 = 3.2x
    think_s: float = 0.3           # tool execution between turns
    # A cold session's uncached document: sized so that its prefill takes seconds (about 2 s on an AMX Xeon
    # core), as a ~140k-token prompt does on a GPU, while one prefill core still keeps up with the arrivals.
    # 8,192 tokens took under 1 s there: aggregated workers then absorbed it with no decode tail to remove.
    cold_tokens: int = 16384
    cold_sessions: int = 10
    cold_interval_s: float = 5.0   # one cold arrival every this many seconds


@dataclass
class Turn:
    kind: str                      # "warm-first", "warm-returning" or "cold"
    start: float
    ttft: float = 0.0
    gaps: list[float] = field(default_factory=list)  # inter-token latencies of this turn
    prompt_tokens: int = 0
    cached_tokens: int = 0
    tokens: list[int] = field(default_factory=list)
    error: str | None = None


def token_ids(length: int, rng: random.Random) -> list[int]:
    return [rng.randrange(300, 4000) for _ in range(length)]


# ---- load ------------------------------------------------------------------------------------

async def stream_turn(http: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int, session: str,
                      kind: str) -> Turn:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
    turn = Turn(kind, time.perf_counter())
    last = None
    try:
        async with http.stream("POST", f"{url}/v1/completions", json=body, headers={"X-Session-ID": session}) as resp:
            if resp.status_code != 200:
                turn.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return turn
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    turn.error = chunk["error"]["message"]
                    return turn
                now = time.perf_counter()
                for choice in chunk.get("choices", []):
                    if not choice.get("token_ids"):
                        continue
                    if last is None:
                        turn.ttft = now - turn.start
                    else:
                        turn.gaps.append(now - last)
                    last = now
                    turn.tokens += choice["token_ids"]
                if chunk.get("usage"):
                    turn.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    turn.cached_tokens = (chunk["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    except httpx.HTTPError as exc:
        turn.error = repr(exc)
    return turn


async def warm_session(http, url: str, w: Workload, index: int, shared: list[int], turns: list[Turn]) -> None:
    rng = random.Random(100 + index)
    prompt = shared + token_ids(w.task_tokens, rng)
    kind = "warm-first"
    for _ in range(w.turns_per_session):
        turn = await stream_turn(http, url, prompt, w.out_tokens, f"warm-{index}", kind)
        turns.append(turn)
        if turn.error:
            await asyncio.sleep(1.0)
            continue
        added = max(int(len(prompt) * w.growth) - len(turn.tokens), 8)
        prompt = prompt + turn.tokens + token_ids(added, rng)  # the answer, then the tool's result
        kind = "warm-returning"
        await asyncio.sleep(w.think_s)


async def cold_arrivals(http, url: str, w: Workload, shared: list[int], turns: list[Turn]) -> None:
    rng = random.Random(7)
    tasks = []
    for n in range(w.cold_sessions):
        await asyncio.sleep(w.cold_interval_s)
        prompt = shared + token_ids(w.cold_tokens, rng)
        tasks.append(asyncio.create_task(stream_turn(http, url, prompt, w.out_tokens, f"cold-{n}", "cold")))
    turns.extend(await asyncio.gather(*tasks))


async def replay(url: str, w: Workload) -> list[Turn]:
    """A fixed trace: every warm session runs its turns while the cold sessions arrive on a fixed schedule.

    Greedy decoding makes every turn's prompt the same in every configuration, so all configurations
    serve the same requests (closed loops bounded by time would not: a faster one grows longer prompts).
    """
    shared = token_ids(w.shared_tokens, random.Random(1))
    turns: list[Turn] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10)) as http:
        # The shared context once, so that it is cached as it would be in a running deployment (and NIXL
        # has done its first handshake).
        await stream_turn(http, url, shared, 4, "prime", "prime")
        await asyncio.gather(*(warm_session(http, url, w, i, shared, turns) for i in range(w.warm_sessions)),
                             cold_arrivals(http, url, w, shared, turns))
    return turns


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(turns: list[Turn]) -> dict:
    ok = [t for t in turns if not t.error]
    returning = [t for t in ok if t.kind == "warm-returning"]
    cold = [t for t in ok if t.kind == "cold"]
    gaps = [g for t in ok for g in t.gaps]
    # ITL as aiperf / genai-perf define it: per request, (last token - first token) / (tokens - 1); then
    # percentiles over requests. A prefill that stalls a decoding request shows up in that request's ITL.
    itl = lambda turns: [statistics.mean(t.gaps) for t in turns if t.gaps]  # noqa: E731
    itls = itl(ok)
    return {
        "turns": len(ok), "errors": len(turns) - len(ok), "cold_turns": len(cold),
        "p50_itl_s": percentile(itls, 0.5), "p90_itl_s": percentile(itls, 0.9), "p99_itl_s": percentile(itls, 0.99),
        # which requests the tail is made of: the warm sessions' returning turns or the cold sessions
        "returning_p90_itl_s": percentile(itl(returning), 0.9), "cold_p90_itl_s": percentile(itl(cold), 0.9),
        "p50_token_gap_s": percentile(gaps, 0.5), "p90_token_gap_s": percentile(gaps, 0.9),
        "max_token_gap_s": max(gaps, default=float("nan")),
        "p50_ttft_s": percentile([t.ttft for t in ok], 0.5), "p90_ttft_s": percentile([t.ttft for t in ok], 0.9),
        "returning_p50_ttft_s": percentile([t.ttft for t in returning], 0.5),
        "cold_p50_ttft_s": percentile([t.ttft for t in cold], 0.5),
        "returning_hit_rate": (sum(t.cached_tokens for t in returning) / max(1, sum(t.prompt_tokens for t in returning))),
        "mean_prompt_tokens": statistics.mean(t.prompt_tokens for t in ok) if ok else float("nan"),
        "output_tokens_per_s": sum(len(t.tokens) for t in ok) / max(1e-9, _span(ok)),
        "wall_s": _span(ok),
    }


def _span(turns: list[Turn]) -> float:
    if not turns:
        return 0.0
    return max(t.start + t.ttft + sum(t.gaps) for t in turns) - min(t.start for t in turns)


# ---- stacks ----------------------------------------------------------------------------------

def run_stack(name: str, tmp: Path, w: Workload, workers: int, args: list[str], env: dict | None = None) -> dict:
    """Starts a stack, replays the workload, reads the workers' vLLM counters, stops it."""
    print(f"   [{name}] starting ({' '.join(args) or f'{workers} aggregated worker(s)'})", flush=True)
    nixl = ["--nixl-side-channel-base-port", str(free_port_block(workers, start=31500))]
    stack = start_stack(tmp / name, workers=workers, extra_args=args + nixl, timeout_s=900,
                        extra_env={"ROLLOUT_SERVE_TRACES__ENABLED": "false", **(env or {})})
    try:
        summary = summarize(asyncio.run(replay(stack.url, w)))
        ports = [stack.worker_system_port(i) for i in range(workers)]
        summary["queue_time_mean_s_worker0"] = (vllm_counter(ports[0], "vllm:request_queue_time_seconds_sum")
                                                / max(1.0, vllm_counter(ports[0], "vllm:request_queue_time_seconds_count")))
        # Where a turn's first token waits (disaggregated: worker 0 prefills, the last worker decodes); p50 from
        # vLLM's histograms (buckets from 1 ms: engine/supervisor/stack.py LATENCY_BUCKETS).
        for worker, port in (("worker0", ports[0]), ("last_worker", ports[-1])):
            for what, metric in (("queue", "vllm:request_queue_time_seconds"),
                                 ("prefill", "vllm:request_prefill_time_seconds")):
                p50 = vllm_quantile(port, metric, 0.5)
                summary[f"{what}_ms_p50_{worker}"] = None if p50 is None else p50 * 1e3
        transfers = vllm_counter(ports[-1], "vllm:nixl_xfer_time_seconds_count")
        summary["kv_transfer_ms_mean"] = (vllm_counter(ports[-1], "vllm:nixl_xfer_time_seconds_sum") * 1e3 / transfers
                                          if transfers else None)
        for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
            summary[f"prompt_tokens_{source}_last_worker"] = vllm_counter(
                ports[-1], "vllm:prompt_tokens_by_source_total", source=source)
    finally:
        stack.stop()
    print(f"   [{name}] p50/p90 ITL {summary['p50_itl_s'] * 1e3:.1f}/{summary['p90_itl_s'] * 1e3:.1f} ms, "
          f"p50 TTFT {summary['p50_ttft_s']:.3f} s (returning {summary['returning_p50_ttft_s']:.3f}, "
          f"cold {summary['cold_p50_ttft_s']:.3f}), {summary['turns']} turns, {summary['errors']} errors", flush=True)
    return summary


# ---- the DRAM tier ---------------------------------------------------------------------------

@dataclass(frozen=True)
class TierWorkload:
    sessions: int = 6
    turns: int = 3
    first_tokens: int = 3000
    turn_tokens: int = 120
    out_tokens: int = 16
    max_model_len: int = 8192
    kv_cache_gib: float = 0.02     # ~10k tokens of the tiny model's KV: fewer than the sessions hold
    tier_gib: float = 0.5


async def returning_turns(url: str, t: TierWorkload) -> list[Turn]:
    """Sessions interleaved turn by turn, so that each one's prefix is evicted before it returns."""
    rngs = [random.Random(500 + s) for s in range(t.sessions)]
    prompts = [token_ids(t.first_tokens, rng) for rng in rngs]
    out: list[Turn] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10)) as http:
        for turn in range(t.turns):
            for s in range(t.sessions):
                result = await stream_turn(http, url, prompts[s], t.out_tokens, f"tier-{s}",
                                           "warm-first" if turn == 0 else "warm-returning")
                out.append(result)
                prompts[s] = prompts[s] + result.tokens + token_ids(t.turn_tokens, rngs[s])
    return out


def measure_returning_turns(tmp: Path, t: TierWorkload, tier_enabled: bool) -> dict:
    """Returning-turn prefix hit rate and TTFT on one small-cache worker, with the tier on or off."""
    env = {"ROLLOUT_SERVE_KV_TIER__ENABLED": str(tier_enabled).lower(),
           "ROLLOUT_SERVE_KV_TIER__CAPACITY_GIB": str(t.tier_gib),
           "ROLLOUT_SERVE_KV_TIER__PORT_BASE": str(free_port_block(3, start=32000))}
    name = f"tier-{'on' if tier_enabled else 'off'}"
    print(f"   [{name}] starting", flush=True)
    stack = start_stack(tmp / name, workers=1, timeout_s=900,
                        extra_args=["--max-model-len", str(t.max_model_len), "--kv-cache-gib", str(t.kv_cache_gib)],
                        extra_env={"ROLLOUT_SERVE_TRACES__ENABLED": "false", **env})
    try:
        turns = asyncio.run(returning_turns(stack.url, t))
    finally:
        stack.stop()
    returning = [x for x in turns if x.kind == "warm-returning" and not x.error]
    errors = [x.error for x in turns if x.error]
    result = {"hit_rate": sum(x.cached_tokens for x in returning) / max(1, sum(x.prompt_tokens for x in returning)),
              "ttft_s": percentile([x.ttft for x in returning], 0.5), "errors": len(errors)}
    print(f"   [{name}] returning turns: hit rate {result['hit_rate']:.1%}, p50 TTFT {result['ttft_s']:.3f} s, "
          f"{len(errors)} errors {errors[:1]}", flush=True)
    return result


# ---- main ------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="shorter runs (a smoke test of the benchmark)")
    parser.add_argument("--budgets", type=int, nargs=2, default=[DisaggregationSettings().prefill_budget_tokens, 4096],
                        help="the two prefill token budgets compared (the first is the default; the second halves "
                             "it, as Prime Intellect did)")
    parser.add_argument("--rounds", type=int, default=2, help="aggregated/disaggregated pairs, order alternating")
    parser.add_argument("--skip-tier", action="store_true")
    parser.add_argument("--skip-transfers", action="store_true", help="no layer-major vs block-major transfers")
    parser.add_argument("--skip-variants", action="store_true", help="only aggregated vs default disaggregated")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the figures go (default: %(default)s)")
    parser.add_argument("--baselines", action="store_true",
                        help="also aggregated and disaggregated without cold sessions (decode capacity alone)")
    opts = parser.parse_args()
    w = Workload(turns_per_session=10, cold_sessions=4) if opts.quick else Workload()
    ensure_tiny_model(0, CACHE_DIR / "models")
    tmp = Path(tempfile.mkdtemp(prefix="agentic-bench-"))
    fig: dict = {f"workload_{k}": v for k, v in dataclasses.asdict(w).items()}

    print(f"== 1. aggregated vs disaggregated, same 2 cores: {w.warm_sessions} warm sessions over a "
          f"{w.shared_tokens}-token shared context (+{w.growth:.0%} a turn, {w.turns_per_session} turns each), "
          f"{w.cold_sessions} cold sessions of {w.cold_tokens} new tokens, one every {w.cold_interval_s:.0f} s",
          flush=True)
    disagg = ["--prefill-workers", "1", "--decode-workers", "1"]
    default_disagg = disagg + ["--prefill-budget-tokens", str(opts.budgets[0])]
    runs: dict[str, dict] = {}
    for r in range(opts.rounds):  # alternate the order: drift from the machine's other load hits both alike
        order = [("agg", []), ("disagg", default_disagg)]
        for name, args in order if r % 2 == 0 else order[::-1]:
            runs[f"{name}_r{r}"] = run_stack(f"{name}-r{r}", tmp, w, 2, args)
    if not opts.skip_variants:
        # Twice the warm sessions and cold arrivals twice as often: both aggregated workers carry decode, and one
        # prefill core is busy most of the time. Where the default load leaves the two apart, this one does not.
        heavy = dataclasses.replace(w, warm_sessions=2 * w.warm_sessions, cold_sessions=2 * w.cold_sessions,
                                    cold_interval_s=w.cold_interval_s / 2)
        fig.update({f"heavy_workload_{k}": getattr(heavy, k) for k in ("warm_sessions", "cold_sessions",
                                                                        "cold_interval_s")})
        runs["agg_heavy"] = run_stack("agg-heavy", tmp, heavy, 2, [])
        runs["disagg_heavy"] = run_stack("disagg-heavy", tmp, heavy, 2, default_disagg)
        # Dynamo's load-aware conditional disaggregation: a prompt is prefilled on the decode worker while the
        # prefill worker holds more than a budget of pending prefill tokens (not the default: see docs/benchmarks.md).
        runs["disagg_heavy_load_aware"] = run_stack("disagg-heavy-load-aware", tmp, heavy, 2,
                                                    default_disagg + ["--disagg-local-when-prefill-busy", "1.0"])
        runs["disagg_always_remote"] = run_stack("disagg-always-remote", tmp, w, 2,
                                                 disagg + ["--disagg-local-max-uncached-tokens", "0"])
        runs["disagg_budget2"] = run_stack(f"disagg-budget-{opts.budgets[1]}", tmp, w, 2,
                                           disagg + ["--prefill-budget-tokens", str(opts.budgets[1])])
    if opts.baselines:
        warm_only = dataclasses.replace(w, cold_sessions=0)
        runs["agg_no_cold"] = run_stack("agg-no-cold", tmp, warm_only, 2, [])
        runs["disagg_no_cold"] = run_stack("disagg-no-cold", tmp, warm_only, 2, disagg)
    for name, summary in runs.items():
        fig.update({f"{name}_{k}": v for k, v in summary.items()})
    # Headline ratios: per round (the two runs of a round are back to back), then the median over rounds.
    for key, figure in (("p90_itl_s", "p90_itl_ratio_disagg_over_agg"), ("p50_ttft_s", "ttft_ratio_disagg_over_agg"),
                        ("p50_itl_s", "p50_itl_ratio_disagg_over_agg"),
                        ("cold_p50_ttft_s", "cold_ttft_ratio_disagg_over_agg"),
                        ("returning_p50_ttft_s", "returning_ttft_ratio_disagg_over_agg")):
        ratios = [runs[f"disagg_r{r}"][key] / runs[f"agg_r{r}"][key] for r in range(opts.rounds)]
        fig[figure] = statistics.median(ratios)
        fig[f"{figure}_worst_round"] = max(ratios)
        fig.update({f"{figure}_r{r}": ratio for r, ratio in enumerate(ratios)})
    dis = runs["disagg_r0"]
    if "disagg_heavy" in runs:
        for key in ("p90_itl_s", "cold_p50_ttft_s", "p50_ttft_s"):
            for variant in ("disagg_heavy", "disagg_heavy_load_aware"):
                fig[f"heavy_{key.removesuffix('_s')}_ratio_{variant.removeprefix('disagg_heavy').lstrip('_') or 'default'}"
                    "_over_agg"] = runs[variant][key] / runs["agg_heavy"][key]
    if "disagg_budget2" in runs:
        fig["prefill_budget_default"], fig["prefill_budget_other"] = opts.budgets
        fig["prefill_cold_ttft_ratio_budget2_over_default"] = (runs["disagg_budget2"]["cold_p50_ttft_s"]
                                                               / dis["cold_p50_ttft_s"])
        fig["prefill_queue_time_ratio_budget2_over_default"] = (runs["disagg_budget2"]["queue_time_mean_s_worker0"]
                                                                / max(1e-9, dis["queue_time_mean_s_worker0"]))
        for budget, run in zip(opts.budgets, (dis, runs["disagg_budget2"])):
            fig[f"prefill_queue_ms_p50_budget{budget}"] = run["queue_ms_p50_worker0"]
            fig[f"cold_ttft_s_p50_budget{budget}"] = run["cold_p50_ttft_s"]

    if not opts.skip_tier:
        t = TierWorkload(sessions=4, turns=2) if opts.quick else TierWorkload()
        print(f"== 2. returning turns, one worker with a {t.kv_cache_gib} GiB KV cache, {t.sessions} sessions of "
              f"{t.first_tokens}+ tokens, interleaved: without and with the DRAM tier", flush=True)
        off = measure_returning_turns(tmp, t, False)
        fig.update({"returning_hit_rate_without_tier": off["hit_rate"], "returning_ttft_s_without_tier": off["ttft_s"]})
        try:
            on = measure_returning_turns(tmp, t, True)
        except RuntimeError as exc:  # the tier stack did not start: report it, keep the other figures
            print(f"   [tier-on] did not start: {str(exc)[-600:]}", flush=True)
            fig.update({"returning_hit_rate_with_tier": None, "tier_error": str(exc)[-600:]})
        else:
            fig.update({"returning_hit_rate_with_tier": on["hit_rate"], "returning_ttft_s_with_tier": on["ttft_s"],
                        "returning_ttft_ratio_with_over_without_tier": on["ttft_s"] / off["ttft_s"],
                        "tier_errors": on["errors"] + off["errors"]})

    if not opts.skip_tier:
        print("== 3. the tier filled: NVFP4 vs lossless objects, same capacity", flush=True)
        fig.update(kv_tier_fill.measure(tmp, opts.quick))
    if not opts.skip_transfers:
        print("== 4. prefill-to-decode KV transfers: layer-major (vLLM's default) vs block-major (BLHNC)", flush=True)
        fig.update(pd_transfers.measure(tmp, opts.quick))

    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(fig, indent=2) + "\n")
    report(fig, runs, opts.out)


def report(fig: dict, runs: dict, out: Path) -> None:
    print("\n   (ITL: per request, then percentiles over requests; gap: between two tokens)")
    print("                          p50 ITL   p90 ITL  p90 gap  max gap  p50 TTFT  returning  cold TTFT  out tok/s")
    for name, s in runs.items():
        print(f"   {name:22s} {s['p50_itl_s'] * 1e3:7.1f}ms {s['p90_itl_s'] * 1e3:7.1f}ms "
              f"{s['p90_token_gap_s'] * 1e3:6.1f}ms {s['max_token_gap_s']:6.2f}s {s['p50_ttft_s']:8.3f}s "
              f"{s['returning_p50_ttft_s']:9.3f}s {s['cold_p50_ttft_s']:9.3f}s {s['output_tokens_per_s']:9.1f}")
    rounds = sorted(k for k in fig if k.startswith("p90_itl_ratio_disagg_over_agg_r"))
    per_round = " ".join(f"{fig[k]:.2f}" for k in rounds)
    print(f"\n   p90 ITL disagg / agg = {fig['p90_itl_ratio_disagg_over_agg']:.2f} (median; rounds {per_round})"
          "   (goal <= 0.6)")
    per_round = " ".join(f"{fig[k.replace('p90_itl', 'ttft')]:.2f}" for k in rounds)
    print(f"   p50 TTFT disagg / agg = {fig['ttft_ratio_disagg_over_agg']:.2f} (median; rounds {per_round})")
    if fig.get("returning_hit_rate_with_tier") is not None:
        print(f"   returning-turn hit rate: {fig['returning_hit_rate_without_tier']:.1%} without the tier, "
              f"{fig['returning_hit_rate_with_tier']:.1%} with it; TTFT ratio with/without "
              f"{fig['returning_ttft_ratio_with_over_without_tier']:.2f}")
    print(f"   cold TTFT disagg / agg = {fig['cold_ttft_ratio_disagg_over_agg']:.2f} (worst round "
          f"{fig['cold_ttft_ratio_disagg_over_agg_worst_round']:.2f}; goal <= 1.2)")
    for key in sorted(k for k in fig if k.startswith("prefill_queue_ms_p50_budget")):
        print(f"   prefill queue p50 at budget {key.rsplit('budget', 1)[1]}: {fig[key]} ms")
    for key in ("tier_tokens_held_nvfp4_over_lossless", "returning_hit_rate_nvfp4_tier",
                "returning_hit_rate_lossless_tier", "nvfp4_greedy_agreement", "descriptors_per_request_default_over_blhnc",
                "kv_transfer_ms_p50_default_over_blhnc", "descriptors_per_request_default_over_blhnc_tiny",
                "kv_transfer_ms_p50_default_over_blhnc_tiny"):
        if key in fig:
            print(f"   {key} = {fig[key]}")
    print(f"\n   wrote {out}")


if __name__ == "__main__":
    main()
