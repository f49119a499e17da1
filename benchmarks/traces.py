"""Trace pipeline benchmark: serving with capture on vs off, writer throughput with the WAL on, export speed.

    .venv/bin/python benchmarks/traces.py [--records 5000] [--out benchmarks/results/traces.json]

Capture: the same concurrent load through three real stacks (front door + Dynamo + one
vLLM worker) up side by side: trace capture off, on (the default, every sampled token's
logprob kept, which the engine then computes for every request), and on with ids only
(capture_logprobs off: the capture alone). Completion tokens per second, each over off,
medians of per-round ratios over 12 rounds whose order rotates.

Writer: `--concurrency` asyncio producers call `await TraceCapture.record()` with the
default settings (ack="durable": each call returns after its group commit's fsync,
redaction on, zstd Parquet). The clock runs from the first record to the end of
close(), so the final seal is included. Records have 2048 tokens (1536 prompt +
512 completion, with logprobs) and ~4 KB of chat text.
Export: `export()` of everything written, per format, records read per second.
Writes one flat JSON object.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trace_pipeline.capture import TraceCapture
from trace_pipeline.export import export
from trace_pipeline.records import TraceRecord
from trace_pipeline.settings import TraceSettings

PROMPT_TOKENS, COMPLETION_TOKENS = 1536, 512
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex".split()


def make_records(n: int, seed: int = 0) -> list[TraceRecord]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 150_000, size=(n, PROMPT_TOKENS + COMPLETION_TOKENS))
    logprobs = -rng.exponential(1.0, size=(n, COMPLETION_TOKENS))
    text = " ".join(rng.choice(WORDS, size=400))
    now = time.time()
    return [TraceRecord(
        request_id=f"req-{i}", session_id=f"sess-{i // 4}", team="bench", model="org/bench-8b",
        policy_version=1, endpoint="chat.completions", created_at=now + i * 1e-3,
        request_messages=[{"role": "system", "content": "You are helpful."},
                          {"role": "user", "content": text}],
        tools=None, prompt_text=None, output_message={"role": "assistant", "content": text},
        output_text=None, sampling_params={"temperature": 1.0, "max_tokens": COMPLETION_TOKENS},
        prompt_token_ids=tokens[i, :PROMPT_TOKENS].tolist(),
        completion_token_ids=tokens[i, PROMPT_TOKENS:].tolist(),
        completion_logprobs=logprobs[i].tolist(), finish_reason="length", queue_ms=1.0,
        ttft_ms=40.0, inter_token_ms=[12.0] * (COMPLETION_TOKENS - 1), total_ms=6000.0,
        cached_tokens=1024, worker_ids=["decode-0", "prefill-0"]) for i in range(n)]


def measure_writer(store_dir: Path, records: list[TraceRecord], concurrency: int,
                   settings: dict) -> dict:
    capture = TraceCapture(TraceSettings(dir=store_dir, **settings))
    capture.start()
    pending = iter(records)

    async def producer():
        for rec in pending:
            await capture.record(rec)

    async def run_all():
        await asyncio.gather(*(producer() for _ in range(concurrency)))

    start, cpu_start = time.perf_counter(), cpu_seconds()
    asyncio.run(run_all())
    capture.close()
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu_start
    tokens = sum(len(r.prompt_token_ids) + len(r.completion_token_ids) for r in records)
    assert capture.stats["sealed"] == len(records), capture.stats
    return {"writer_records_per_s": len(records) / seconds, "writer_tokens_per_s": tokens / seconds,
            "writer_seconds": seconds, "writer_cpu_us_per_record": cpu / len(records) * 1e6}


def cpu_seconds() -> float:
    """CPU time of this process, all threads (less sensitive than wall time to other load)."""
    times = os.times()
    return times.user + times.system


def measure_export(store_dir: Path, out_root: Path, n_records: int) -> dict:
    result = {}
    for fmt in ("rl", "sft", "raw"):
        start = time.perf_counter()
        export(store_dir, out_root / fmt, fmt, "bench", progress=False)
        result[f"export_{fmt}_records_per_s"] = n_records / (time.perf_counter() - start)
    result["export_records_per_s"] = result["export_rl_records_per_s"]
    return result


# Serving variants: trace capture off; on (the default: records with every sampled token's logprob, which the
# engine then computes for every request); on with ids only (capture_logprobs off: the capture's own cost).
CAPTURE_VARIANTS = {
    "off": {"ROLLOUT_SERVE_TRACES__ENABLED": "false"},
    "on": {"ROLLOUT_SERVE_TRACES__ENABLED": "true"},
    "ids_only": {"ROLLOUT_SERVE_TRACES__ENABLED": "true", "ROLLOUT_SERVE_TRACES__CAPTURE_LOGPROBS": "false"},
}


def measure_capture_ratio(tmp: Path, rounds: int = 12, requests: int = 32, concurrency: int = 8) -> dict:
    """Serving throughput of each capture variant: one stack per variant, up side by side, loaded in turn for
    `rounds` rounds whose order rotates (this machine's speed drifts between loads more than the variants
    differ); each ratio is the median of its per-round ratios over "off"."""
    from benchmarks.frontdoor import run_load
    from rollout_server.harness.stack import start_stack

    stacks = {variant: start_stack(tmp / f"capture-{variant}", workers=1, extra_env=env)
              for variant, env in CAPTURE_VARIANTS.items()}
    try:
        def throughput(variant: str) -> float:
            load = asyncio.run(run_load(stacks[variant].url, "tiny-qwen2", requests=requests, concurrency=concurrency,
                                        prompt_len=256, max_tokens=64, stream=True))
            time.sleep(1.0)  # every stack idle before the next is loaded
            return load["throughput_tok_s"]

        variants = list(stacks)
        for variant in variants:  # a first load is slow on every server (new batch shapes)
            throughput(variant)
        runs: dict[str, list[float]] = {variant: [] for variant in variants}
        for round_ in range(rounds):
            for variant in variants[round_ % 3:] + variants[:round_ % 3]:
                runs[variant].append(throughput(variant))
            print(f"round {round_ + 1}/{rounds}: " + ", ".join(f"{v} {runs[v][-1]:.0f}" for v in variants) + " tok/s",
                  flush=True)
    finally:
        for stack in stacks.values():
            stack.stop()

    def over_off(variant: str) -> float:
        return statistics.median(a / b for a, b in zip(runs[variant], runs["off"]))

    return {"capture_on_tok_s": statistics.median(runs["on"]), "capture_off_tok_s": statistics.median(runs["off"]),
            "capture_ids_only_tok_s": statistics.median(runs["ids_only"]),
            "capture_throughput_ratio": over_off("on"), "capture_ids_only_throughput_ratio": over_off("ids_only")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--zstd-level", type=int, default=TraceSettings().zstd_level)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "traces.json")
    parser.add_argument("--skip-serving", action="store_true", help="only the writer and export figures")
    args = parser.parse_args()
    records = make_records(args.records)
    with tempfile.TemporaryDirectory(prefix="traces-bench-") as tmp:
        tmp = Path(tmp)
        result = {"records": args.records, "tokens_per_record": PROMPT_TOKENS + COMPLETION_TOKENS,
                  "concurrency": args.concurrency, "cpu_count": os.cpu_count(),
                  "machine": platform.machine(), "zstd_level": args.zstd_level,
                  "load_average_1m_before": os.getloadavg()[0]}
        result.update(measure_writer(tmp / "store", records, args.concurrency,
                                     {"zstd_level": args.zstd_level}))
        result.update(measure_export(tmp / "store", tmp / "export", args.records))
        if not args.skip_serving:
            result.update(measure_capture_ratio(tmp / "serving"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
