"""Front door overhead and KV-aware session routing, measured in one run.

1. The same concurrent load sent directly to a plain vLLM OpenAI server (the baseline; its
   processes placed as in a rollout-serve stack: engine/supervisor/cpu_placement.py) and through
   rollout-serve (front door -> Dynamo KV router -> one vLLM worker): throughput
   (completion tokens/s) and p50/p90 request latency. The front door asks its engine for
   every sampled token's logprob by default (traces keep them: traces.capture_logprobs), work
   the plain server does only when its client asks; so the baseline's client asks for them too.
   `throughput_ratio`: the front door at its defaults over plain vLLM asked for the same
   logprobs. Twice: streamed responses, and whole ones (stream=false); each figure is the
   worse of the two. The same load also goes to that stack's Dynamo frontend directly, asked
   what the front door asks of it (`dynamo_throughput_ratio`: Dynamo's frontend and worker
   without the front door, over plain vLLM; `frontdoor_over_dynamo_throughput_ratio`: what the
   front door costs on top). Ratios are medians of per-round ratios (targets loaded in turn,
   the order rotating), with a 90% bootstrap interval: this machine's speed drifts between
   loads more than the targets differ. The load generator runs in this process, off the engine's
   core; what it spends itself is `*_client_cpu_ms_per_token`.
   --all-targets adds plain vLLM asked no logprobs and the front door with capture_logprobs
   off: what the logprobs cost each side.
   Why the ratios differ, per target: the median time to first token under the load, and the
   tokens each engine step generated (from vLLM's own metrics): a request that takes longer to
   reach the engine leaves its slot of the batch empty meanwhile (`tokens_per_step_ratio`), and
   the time a request spends outside the engine (`*_path_ms`: client latency less vLLM's own
   request latency, arrival at its engine client to the last token), and the same time for a request sent
   alone after the rounds (`*_lone_path_ms`: what the hops on its way cost before any queueing).
2. Long multi-turn sessions over two workers, with Dynamo's KV router + session
   affinity vs round-robin: TTFT of returning turns vs cold first turns, and the
   prompt cache hit rate of returning turns.

Run: .venv/bin/python benchmarks/frontdoor.py   (about 10 minutes on 2 cores)
Writes benchmarks/results/frontdoor.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine import stream_interval  # noqa: E402
from engine.settings import EngineSettings  # noqa: E402
from engine.supervisor.compute_dtype import worker_dtype  # noqa: E402
from engine.supervisor.cpu_placement import host_cores  # noqa: E402
from engine.supervisor.health import vllm_counter  # noqa: E402
from rollout_server.harness.stack import CACHE_DIR, free_port_block, start_stack, wait_until_answering  # noqa: E402
from rollout_server.tiny_model.builder import ensure_tiny_model  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "frontdoor.json"
MODEL = "tiny-qwen2"
SETTLE_S = 1.0
LONE_REQUESTS = 12


# ---- load ---------------------------------------------------------------------------------

async def one_request(http: aiohttp.ClientSession, url: str, prompt: list[int], max_tokens: int, model: str,
                      stream: bool = True, extra: dict | None = None) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": stream, **(extra or {})}
    start = time.perf_counter()
    if not stream:
        async with http.post(f"{url}/v1/completions", json=body) as resp:
            resp.raise_for_status()
            tokens = (await resp.json())["usage"]["completion_tokens"]
        latency = time.perf_counter() - start
        return {"latency": latency, "ttft": latency, "tokens": tokens}
    body["stream_options"] = {"include_usage": True}
    first = None
    tokens = 0
    async with http.post(f"{url}/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.content:  # one server-sent event line at a time
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and first is None:
                first = time.perf_counter()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return {"latency": time.perf_counter() - start, "ttft": (first or time.perf_counter()) - start, "tokens": tokens}


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_load(url: str, model: str, requests: int, concurrency: int, prompt_len: int, max_tokens: int,
                   stream: bool, extra: dict | None = None) -> dict:
    """The load, from this process: aiohttp, not httpx, because the load generator shares the host core with the
    servers it measures, and httpx spent 2-3x aiohttp's CPU per streamed token (0.12 against 0.05 ms: 17% of
    that core at this load), time that clients on other machines would not take from it."""
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 4000) for _ in range(prompt_len)] for _ in range(requests)]
    queue = list(prompts)
    results = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        warm_up = await one_request(http, url, prompts[0][:16], 4, model)

        async def worker():
            while queue:
                results.append(await one_request(http, url, queue.pop(), max_tokens, model, stream, extra))

        start, cpu_before = time.perf_counter(), own_cpu_seconds()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall, client_cpu = time.perf_counter() - start, own_cpu_seconds() - cpu_before
    latencies = sorted(r["latency"] for r in results)
    tokens = sum(r["tokens"] for r in results)
    return {"throughput_tok_s": tokens / wall, "tokens": tokens,
            "p50_s": latencies[len(latencies) // 2], "p90_s": latencies[int(len(latencies) * 0.9)],
            "ttft_p50_s": statistics.median(r["ttft"] for r in results),
            "client_cpu_ms_per_token": 1000 * client_cpu / max(1, tokens),
            "requests": len(results) + 1, "latency_sum_s": sum(latencies) + warm_up["latency"]}


# ---- the plain vLLM baseline -------------------------------------------------------------

def start_plain_vllm(model_dir: Path, port: int, log: Path, extra_args: tuple[str, ...] = ()) -> subprocess.Popen:
    """vLLM's own OpenAI server on the same model and CPU settings as a rollout-serve worker, its processes
    placed as in a rollout-serve stack."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1",
           "VLLM_NO_USAGE_STATS": "1"}
    argv = [sys.executable, str(Path(__file__).parent / "vllm_server_like_a_worker.py"), "--model", str(model_dir),
            "--served-model-name", MODEL, "--port", str(port), "--host", "127.0.0.1", "--block-size", "32",
            "--enforce-eager", "--kv-cache-memory-bytes", str(2**29), "--max-model-len", "32768",
            "--dtype", worker_dtype(EngineSettings().dtype, model_dir, on_cpu=True), *extra_args]
    proc = subprocess.Popen(argv, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until_answering(f"http://127.0.0.1:{port}/v1/models", proc, log, timeout_s=400)
    except RuntimeError:
        stop_group(proc)
        raise
    return proc


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time the processes have used so far (from /proc)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def engine_steps(metrics_port: int) -> tuple[float, float]:
    """(engine steps, generated tokens) so far, from the vLLM metrics served on `metrics_port` (the plain
    server's port; a Dynamo worker's system port)."""
    return (vllm_counter(metrics_port, "vllm:iteration_tokens_total_count"),
            vllm_counter(metrics_port, "vllm:generation_tokens_total"))


def engine_seconds(metrics_port: int) -> float:
    """The seconds requests have spent in vLLM so far, each from arrival at its engine client to its last
    token (vllm:e2e_request_latency_seconds)."""
    return vllm_counter(metrics_port, "vllm:e2e_request_latency_seconds_sum")


def host_processes(stack) -> list[int]:
    """The processes of a stack that are not vLLM's engine: the front door, Dynamo's frontend and Dynamo's
    worker (Python)."""
    pids = [stack.process.pid]
    for pid in stack.child_pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"dynamo.frontend" in cmdline or b"engine.worker.dynamo_worker" in cmdline:
            pids.append(pid)
    return pids


def engine_processes(pids: list[int]) -> list[int]:
    """vLLM's engine processes (engine core; model runner where it has its own) among `pids` and their
    descendants."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,comm="], capture_output=True, text=True).stdout
    rows = [(int(pid), int(ppid), comm) for pid, ppid, comm in (line.split(None, 2) for line in out.splitlines())]
    tree = set(pids)
    while grown := {pid for pid, ppid, _ in rows if ppid in tree} - tree:
        tree |= grown
    return [pid for pid, _, comm in rows if pid in tree and comm.startswith("VLLM::")]


def stop_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)


# ---- sessions -----------------------------------------------------------------------------

async def session_turn(http: httpx.AsyncClient, url: str, messages: list[dict], session: str) -> dict:
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first, usage, text = None, None, ""
    async with http.stream("POST", f"{url}/v1/chat/completions", json=body,
                           headers={"X-Session-ID": session}) as resp:
        resp.raise_for_status()
        worker = resp.headers.get("x-worker-id")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices"):
                first = first or time.perf_counter()
                text += chunk["choices"][0]["delta"].get("content") or ""
            usage = chunk.get("usage") or usage
    return {"ttft": first - start, "worker": worker, "prompt": usage["prompt_tokens"],
            "cached": usage["prompt_tokens_details"]["cached_tokens"], "text": text}


async def run_sessions(url: str, sessions: int, turns: int, first_words: int, words_per_turn: int) -> dict:
    rng = random.Random(1)
    vocabulary = "def class return import read write file path edit search shell test token cache worker".split()
    words = lambda n: " ".join(rng.choice(vocabulary) for _ in range(n))  # noqa: E731
    histories = [[{"role": "system", "content": f"session {s} " + words(first_words)}] for s in range(sessions)]
    cold, returning = [], []
    async with httpx.AsyncClient(timeout=600) as http:
        for turn in range(turns):
            for s, messages in enumerate(histories):  # sessions interleave, as agents do
                messages.append({"role": "user", "content": words(words_per_turn)})
                result = await session_turn(http, url, messages, f"bench-{s}")
                messages.append({"role": "assistant", "content": result["text"]})
                (cold if turn == 0 else returning).append(result)
    return {
        "cold_ttft_s": statistics.median(r["ttft"] for r in cold),
        "returning_ttft_s": statistics.median(r["ttft"] for r in returning),
        "returning_hit_rate": sum(r["cached"] for r in returning) / sum(r["prompt"] for r in returning),
        "mean_prompt_tokens": statistics.mean(r["prompt"] for r in cold + returning),
    }


# The sampled token's logprob, as the front door asks its engine for it (engine/client/dynamo_http.py)
SAMPLED_LOGPROBS = {"logprobs": 0, "return_tokens_as_token_ids": True}
HEADLINE = {  # name -> what it is: the pair `throughput_ratio` compares, doing the same engine work
    "direct_logprobs": "plain vLLM, client asks logprobs",
    "front": "front door (defaults)",
}
SPLIT = {  # where the front door path's cost lies: the same stack's Dynamo frontend, asked what the front door asks
    "dynamo": "Dynamo frontend directly",
}
LOGPROB_STUDY = {  # --all-targets: what the logprobs cost each side
    "direct": "plain vLLM",
    "front_ids_only": "front door, capture_logprobs off",
}
RATIOS = {  # figure -> (target, baseline), each computed when both were measured
    "throughput_ratio": ("front", "direct_logprobs"),
    "ids_only_throughput_ratio": ("front_ids_only", "direct"),
    "frontdoor_over_plain_throughput_ratio": ("front", "direct"),
    "plain_logprobs_throughput_ratio": ("direct_logprobs", "direct"),
    "capture_logprobs_throughput_ratio": ("front", "front_ids_only"),
    "dynamo_throughput_ratio": ("dynamo", "direct_logprobs"),
    "frontdoor_over_dynamo_throughput_ratio": ("front", "dynamo"),
}


def dynamo_direct_body(stream: bool) -> dict:
    """What the front door adds to each request it sends Dynamo's frontend (engine/client/dynamo_http.py): the
    sampled tokens' logprobs and, for a whole response, its stream interval setting (whole responses travel
    from the worker in messages of that many tokens)."""
    if stream:
        return SAMPLED_LOGPROBS
    return {**SAMPLED_LOGPROBS, "nvext": {"annotations": [stream_interval.annotation(EngineSettings().unstreamed_interval)]}}


def measure_overhead(model_dir: Path, tmp: Path, interval: int, streams: tuple[bool, ...], rounds: int,
                     load: dict, all_targets: bool) -> dict:
    """The targets side by side (one worker each), for each load in `streams` (True: streamed responses, False:
    whole responses). `interval`: the stream interval of streamed responses on both sides (vLLM
    --stream-interval; rollout-serve's stream_interval setting)."""
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port_block(1, start=29000)
    vllm = start_plain_vllm(model_dir, port, tmp / "vllm.log", ("--stream-interval", str(interval)))
    interval_args = ["--stream-interval", str(interval)]
    stacks = {"front": start_stack(tmp / "front", workers=1, extra_args=interval_args)}
    if all_targets:
        stacks["front_ids_only"] = start_stack(tmp / "front-ids-only", workers=1, extra_args=interval_args,
                                               extra_env={"ROLLOUT_SERVE_TRACES__CAPTURE_LOGPROBS": "false"})
    direct = f"http://127.0.0.1:{port}"
    either = lambda fields: {True: fields, False: fields}  # noqa: E731
    # name -> (url, {streamed: the extra request fields})
    targets = {"direct_logprobs": (direct, either(SAMPLED_LOGPROBS)),
               **{name: (s.url, either({})) for name, s in stacks.items()},
               "dynamo": (stacks["front"].frontend_url, {stream: dynamo_direct_body(stream) for stream in (True, False)})}
    if all_targets:
        targets["direct"] = (direct, either({}))
    labels = {**HEADLINE, **SPLIT, **LOGPROB_STUDY}
    # CPU spent outside vLLM's engine per completion token (the plain server's API process; the front door,
    # Dynamo's frontend and Dynamo's worker process), and in the engine (its scheduler and model)
    host = {name: host_processes(s) for name, s in stacks.items()}
    engine = {name: engine_processes(s.child_pids()) for name, s in stacks.items()}
    metrics_port = {name: s.worker_system_port() for name, s in stacks.items()}
    for name in ("direct", "direct_logprobs"):
        host[name], engine[name] = [vllm.pid], engine_processes([vllm.pid])
        metrics_port[name] = port
    host["dynamo"] = [pid for pid in host["front"] if pid != stacks["front"].process.pid]
    engine["dynamo"], metrics_port["dynamo"] = engine["front"], metrics_port["front"]
    figures = {}
    every_core = os.sched_getaffinity(0)
    # The load generator stays off the engine's core (0), as clients on other machines would.
    os.sched_setaffinity(0, host_cores({0}, os.cpu_count() or 1))
    try:
        for stream in streams:
            kind = f"streamed, stream interval {interval}" if stream else "whole responses (stream=false)"
            print(f"== 1. overhead, {kind}: plain vLLM vs rollout-serve (1 worker), same load, {rounds} interleaved "
                  "rounds", flush=True)
            runs: dict[str, list[dict]] = {name: [] for name in targets}
            for url, extra in targets.values():  # a first full load is slow on every server (new batch shapes)
                asyncio.run(run_load(url, MODEL, **load, stream=stream, extra=extra[stream]))
            for round_ in range(rounds):  # every server stays up; the order rotates to cancel drift
                shift = round_ % len(targets)
                for name in list(targets)[shift:] + list(targets)[:shift]:
                    url, extra = targets[name]
                    before, engine_before = cpu_seconds(host[name]), cpu_seconds(engine[name])
                    steps_before, in_engine_before = engine_steps(metrics_port[name]), engine_seconds(metrics_port[name])
                    run = asyncio.run(run_load(url, MODEL, **load, stream=stream, extra=extra[stream]))
                    steps, generated = (a - b for a, b in zip(engine_steps(metrics_port[name]), steps_before))
                    run["tokens_per_step"] = generated / max(1.0, steps)
                    in_engine = engine_seconds(metrics_port[name]) - in_engine_before
                    run["path_ms"] = 1000 * (run["latency_sum_s"] - in_engine) / run["requests"]
                    run["host_cpu_ms_per_token"] = 1000 * (cpu_seconds(host[name]) - before) / max(1, run["tokens"])
                    run["engine_cpu_ms_per_token"] = (1000 * (cpu_seconds(engine[name]) - engine_before)
                                                      / max(1, run["tokens"]))
                    time.sleep(SETTLE_S)  # every server is idle before the next one is loaded
                    runs[name].append(run)
            lone = {name: lone_request_path_ms(url, extra[stream], stream, metrics_port[name], load)
                    for name, (url, extra) in targets.items()}
            suffix = ("_streamed" if interval == 1 else f"_streamed_interval_{interval}") if stream else "_unstreamed"
            figures.update({f"{key}{suffix}": value for key, value in _overhead_figures(runs, labels, stream).items()})
            figures.update({f"{name}_lone_path_ms{suffix}": ms for name, ms in lone.items()})
            print("   one request at a time, its time outside the engine: "
                  + ", ".join(f"{labels[name]} {ms:.1f} ms" for name, ms in lone.items()), flush=True)
    finally:
        os.sched_setaffinity(0, every_core)
        for stack in stacks.values():
            stack.stop()
        stop_group(vllm)
    return figures


def lone_request_path_ms(url: str, extra: dict, stream: bool, metrics_port: int, load: dict) -> float:
    """A request's time outside the engine when no other request is running: what each hop on its way costs
    before any queueing on the shared host core (under the load, `path_ms`, that time also holds the waits)."""
    in_engine_before = engine_seconds(metrics_port)
    run = asyncio.run(run_load(url, MODEL, LONE_REQUESTS, 1, load["prompt_len"], load["max_tokens"], stream, extra))
    return 1000 * (run["latency_sum_s"] - (engine_seconds(metrics_port) - in_engine_before)) / run["requests"]


def _round_ratios(runs: dict[str, list[dict]], target: str, baseline: str) -> list[float]:
    """Target / baseline throughput in each round, the round's two loads close in time."""
    return [t["throughput_tok_s"] / b["throughput_tok_s"] for t, b in zip(runs[target], runs[baseline])]


def _paired_ratio(runs: dict[str, list[dict]], target: str, baseline: str) -> float:
    return statistics.median(_round_ratios(runs, target, baseline))


def _interval_90(ratios: list[float]) -> tuple[float, float]:
    """A 90% bootstrap interval of the median of `ratios`: how closely one run pins the ratio down."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    return medians[100], medians[1899]


def _overhead_figures(runs: dict[str, list[dict]], labels: dict[str, str], streamed: bool) -> dict:
    median = lambda name, key: statistics.median(r[key] for r in runs[name])  # noqa: E731
    for name in runs:
        each = " ".join(f"{r['throughput_tok_s']:.0f}" for r in runs[name])
        print(f"   {labels[name]:34s} {median(name, 'throughput_tok_s'):6.1f} tok/s   p50 {median(name, 'p50_s'):.3f}s   "
              f"p90 {median(name, 'p90_s'):.3f}s   CPU host {median(name, 'host_cpu_ms_per_token'):.3f} "
              f"engine {median(name, 'engine_cpu_ms_per_token'):.3f} client {median(name, 'client_cpu_ms_per_token'):.3f} "
              f"ms/token   (runs: {each})", flush=True)
    figures = {key: _paired_ratio(runs, target, baseline) for key, (target, baseline) in RATIOS.items()
               if target in runs and baseline in runs}
    figures["p90_latency_ratio"] = median("front", "p90_s") / median("direct_logprobs", "p90_s")
    figures["engine_cpu_ratio"] = (median("front", "engine_cpu_ms_per_token")
                                   / median("direct_logprobs", "engine_cpu_ms_per_token"))
    figures["tokens_per_step_ratio"] = median("front", "tokens_per_step") / median("direct_logprobs", "tokens_per_step")
    first_token = (f"; time to first token p50: {1000 * median('front', 'ttft_p50_s'):.0f} vs "
                   f"{1000 * median('direct_logprobs', 'ttft_p50_s'):.0f} ms" if streamed else "")
    print(f"   generated tokens per engine step: front door {median('front', 'tokens_per_step'):.2f}, plain vLLM "
          f"{median('direct_logprobs', 'tokens_per_step'):.2f} (ratio {figures['tokens_per_step_ratio']:.3f})"
          f"{first_token}", flush=True)
    print("   a request's time outside the engine (client latency less vLLM's own): "
          + ", ".join(f"{labels[name]} {median(name, 'path_ms'):.1f} ms" for name in runs), flush=True)
    each = _round_ratios(runs, "front", "direct_logprobs")
    low, high = _interval_90(each)
    figures |= {"throughput_ratio_interval_90_low": low, "throughput_ratio_interval_90_high": high}
    print(f"   front door / plain vLLM at the same engine work, median of per-round ratios: "
          f"{figures['throughput_ratio']:.3f} (90% interval {low:.3f}-{high:.3f}; rounds: "
          f"{' '.join(f'{r:.2f}' for r in each)})", flush=True)
    print(f"   of which Dynamo's frontend and worker / plain vLLM {figures['dynamo_throughput_ratio']:.3f}, "
          f"the front door on top of Dynamo {figures['frontdoor_over_dynamo_throughput_ratio']:.3f}", flush=True)
    if "direct" in runs:
        print(f"   capture_logprobs off / plain vLLM asked no logprobs {figures['ids_only_throughput_ratio']:.3f}; "
              f"defaults / no logprobs {figures['frontdoor_over_plain_throughput_ratio']:.3f}; "
              f"logprobs cost plain vLLM {1 - figures['plain_logprobs_throughput_ratio']:+.1%}, "
              f"the front door {1 - figures['capture_logprobs_throughput_ratio']:+.1%}", flush=True)
    for name in runs:
        figures |= {f"{name}_throughput_tok_s": median(name, "throughput_tok_s"), f"{name}_p50_s": median(name, "p50_s"),
                    f"{name}_p90_s": median(name, "p90_s"),
                    f"{name}_host_cpu_ms_per_token": median(name, "host_cpu_ms_per_token"),
                    f"{name}_engine_cpu_ms_per_token": median(name, "engine_cpu_ms_per_token"),
                    f"{name}_client_cpu_ms_per_token": median(name, "client_cpu_ms_per_token"),
                    f"{name}_tokens_per_step": median(name, "tokens_per_step"), f"{name}_path_ms": median(name, "path_ms")}
        if streamed:
            figures[f"{name}_ttft_p50_s"] = median(name, "ttft_p50_s")
    return figures


# ---- main ---------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=16, help="interleaved runs of each target")
    parser.add_argument("--all-targets", action="store_true",
                        help="also plain vLLM asked no logprobs and the front door with capture_logprobs off "
                             "(what the logprobs cost each side)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--compare-stream-interval", type=int, default=0,
                        help="also measure streamed responses with this stream interval on both sides (0: skip)")
    parser.add_argument("--skip-sessions", action="store_true", help="only the overhead part")
    parser.add_argument("--sessions", type=int, default=3, help="odd, so round-robin alternates workers")
    parser.add_argument("--turns", type=int, default=4)
    args = parser.parse_args()
    model_dir = ensure_tiny_model(0, CACHE_DIR / "models")
    tmp = Path(tempfile.mkdtemp(prefix="frontdoor-bench-"))
    load = dict(requests=args.requests, concurrency=args.concurrency, prompt_len=args.prompt_len, max_tokens=args.max_tokens)
    figures: dict = {}

    figures.update(measure_overhead(model_dir, tmp / "default", 1, (True, False), args.rounds, load, args.all_targets))
    if args.compare_stream_interval > 1:
        figures.update(measure_overhead(model_dir, tmp / "interval", args.compare_stream_interval, (True,),
                                        args.rounds, load, args.all_targets))
    # Each headline is the worse of the two loads: streamed (chat UIs, agents) and whole responses (RL rollouts).
    for ratio in RATIOS:
        if f"{ratio}_streamed" in figures:
            figures[ratio] = min(figures[f"{ratio}_streamed"], figures[f"{ratio}_unstreamed"])

    if args.skip_sessions:
        print(json.dumps(figures, indent=1))
        return
    print("== 2. long sessions over 2 workers: KV router + session affinity vs round-robin", flush=True)
    sessions = dict(sessions=args.sessions, turns=args.turns, first_words=6000, words_per_turn=600)
    for mode in ("kv", "round-robin"):
        stack = start_stack(tmp / mode, workers=2, extra_args=["--router-mode", mode])
        try:
            result = asyncio.run(run_sessions(stack.url, **sessions))
        finally:
            stack.stop()
        key = "sticky" if mode == "kv" else "round_robin"
        print(f"   {mode:12s} cold TTFT {result['cold_ttft_s']:.3f}s   returning TTFT {result['returning_ttft_s']:.3f}s   "
              f"returning hit rate {result['returning_hit_rate']:.1%}   (~{result['mean_prompt_tokens']:.0f} prompt tokens)",
              flush=True)
        figures.update({f"{key}_hit_rate": result["returning_hit_rate"], f"{key}_cold_ttft_s": result["cold_ttft_s"],
                        f"{key}_returning_ttft_s": result["returning_ttft_s"]})
    figures["returning_ttft_ratio"] = figures["sticky_returning_ttft_s"] / figures["sticky_cold_ttft_s"]
    figures["round_robin_returning_ttft_ratio"] = figures["round_robin_returning_ttft_s"] / figures["round_robin_cold_ttft_s"]

    print(f"throughput_ratio (front door / plain vLLM, same engine work) = {figures['throughput_ratio']:.3f}   "
          f"returning_ttft_ratio = {figures['returning_ttft_ratio']:.3f}   "
          f"hit rate sticky {figures['sticky_hit_rate']:.1%} vs round-robin {figures['round_robin_hit_rate']:.1%}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}, indent=1))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
