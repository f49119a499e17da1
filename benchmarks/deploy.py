"""Live deploys under load: how long until every worker serves the new version, and what clients notice.

A 2-worker stack serves a steady streaming load (greedy completions from several
concurrent clients). In one run:
1. throughput before any deploy (the baseline window);
2. full-weight deploys (rolling, one worker at a time), repeated: time from the
   deploy call until every worker serves the new version, and throughput while
   the rollout runs;
3. LoRA adapter deploys: time until the adapter is served on every worker;
4. every request of the run that failed (goal: 0).

Run: .venv/bin/python benchmarks/deploy.py   (about 4 minutes on 2 cores)
Writes benchmarks/results/deploy.json.
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
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rollout_server.harness.checkpoints import copy_checkpoint, write_lora_adapter  # noqa: E402
from rollout_server.harness.stack import CACHE_DIR, start_stack  # noqa: E402
from rollout_server.tiny_model.builder import ensure_tiny_model  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "deploy.json"


@dataclass
class LoadRecord:
    token_times: list[float] = field(default_factory=list)  # arrival time of every completion token
    requests: int = 0
    failures: list[str] = field(default_factory=list)

    def throughput(self, start: float, end: float) -> float:
        return sum(start <= t < end for t in self.token_times) / max(end - start, 1e-9)


async def stream_one(http: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int, record: LoadRecord) -> None:
    body = {"model": "tiny-qwen2", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "return_token_ids": True}
    record.requests += 1
    try:
        async with http.stream("POST", f"{url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                record.failures.append(f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    record.failures.append(chunk["error"]["message"])
                    return
                now = time.perf_counter()
                for choice in chunk["choices"]:
                    record.token_times += [now] * len(choice.get("token_ids", []))
    except httpx.HTTPError as exc:
        record.failures.append(repr(exc))


async def steady_load(url: str, clients: int, max_tokens: int, record: LoadRecord, stop: asyncio.Event) -> None:
    rng = random.Random(0)

    async def client():
        async with httpx.AsyncClient(timeout=600) as http:
            while not stop.is_set():
                prompt = [rng.randrange(10, 4000) for _ in range(64)]
                await stream_one(http, url, prompt, max_tokens, record)

    await asyncio.gather(*(client() for _ in range(clients)))


async def timed_deploy(url: str, body: dict) -> tuple[float, float, dict]:
    async with httpx.AsyncClient(timeout=600) as http:
        start = time.perf_counter()
        response = await http.post(f"{url}/v1/admin/deployments", json={**body, "wait": True})
        end = time.perf_counter()
    if response.status_code != 200:
        raise SystemExit(f"deploy failed: {response.status_code} {response.text}")
    return start, end, response.json()


async def every_worker_serves(url: str, version: int) -> None:
    async with httpx.AsyncClient(timeout=60) as http:
        workers = (await http.get(f"{url}/v1/status")).json()["workers"]
    versions = {w["policy_version"] for w in workers}
    if versions != {version}:
        raise SystemExit(f"after deploying version {version} the workers run {versions}")


def random_adapter(directory: Path, base_dir: Path, seed: int) -> Path:
    write_lora_adapter(directory, base_dir, rank=8, stable=False)
    tensors = load_file(directory / "adapter_model.safetensors")
    generator = torch.Generator().manual_seed(seed)
    save_file({name: torch.randn(t.shape, generator=generator) * 0.1 for name, t in tensors.items()},
              directory / "adapter_model.safetensors", metadata={"format": "pt"})
    (directory / "STABLE").touch()
    return directory


async def run(url: str, work: Path, args) -> dict:
    base_dir = ensure_tiny_model(0, CACHE_DIR / "models")
    finetuned = ensure_tiny_model(1, CACHE_DIR / "models")
    record, stop = LoadRecord(), asyncio.Event()
    load = asyncio.create_task(steady_load(url, args.clients, args.max_tokens, record, stop))
    await asyncio.sleep(args.warmup_s)
    baseline_start = time.perf_counter()
    await asyncio.sleep(args.baseline_s)
    before = record.throughput(baseline_start, time.perf_counter())

    full_s, during = [], []
    for i in range(args.deploys):
        source = finetuned if i % 2 == 0 else base_dir  # alternate, so every deploy really changes the weights
        checkpoint = copy_checkpoint(source, work / f"step-{i}")
        start, end, progress = await timed_deploy(url, {"path": str(checkpoint), "mode": "rolling"})
        await every_worker_serves(url, progress["version"])
        full_s.append(end - start)
        during.append(record.throughput(start, end))
        print(f"full deploy {i + 1}: version {progress['version']} on every worker after {end - start:.2f}s, "
              f"{during[-1]:.0f} tok/s during", flush=True)
        await asyncio.sleep(args.gap_s)

    lora_s = []
    for i in range(args.deploys):
        adapter = random_adapter(work / f"adapter-{i}", base_dir, seed=i)
        start, end, progress = await timed_deploy(url, {"path": str(adapter), "name": "bench-lora"})
        lora_s.append(end - start)
        print(f"LoRA deploy {i + 1}: version {progress['version']} served after {end - start:.2f}s", flush=True)
        await asyncio.sleep(args.gap_s)

    stop.set()
    await load
    during_all = statistics.median(during)
    return {
        "full_deploy_s": round(statistics.median(full_s), 3),
        "full_deploy_s_max": round(max(full_s), 3),
        "lora_deploy_s": round(statistics.median(lora_s), 3),
        "lora_deploy_s_max": round(max(lora_s), 3),
        "failed_requests": len(record.failures),
        "requests": record.requests,
        "throughput_before_tok_s": round(before, 1),
        "throughput_during_update_tok_s": round(during_all, 1),
        "throughput_ratio_during_update": round(during_all / before, 3),
        "deploys": args.deploys,
        "clients": args.clients,
        "workers": 2,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deploys", type=int, default=3, help="full deploys and LoRA deploys, each")
    parser.add_argument("--clients", type=int, default=4, help="concurrent streaming clients")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--baseline-s", type=float, default=20.0)
    parser.add_argument("--gap-s", type=float, default=3.0, help="pause between deploys")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="deploy-bench-") as tmp:
        stack = start_stack(Path(tmp) / "stack", workers=2, extra_args=["--enable-lora"])  # LoRA deploys below
        try:
            results = asyncio.run(run(stack.url, Path(tmp), args))
        finally:
            stack.stop()
    failures = results["failed_requests"]
    print(f"\nfull deploy (rolling, 2 workers): {results['full_deploy_s']:.2f}s median to every worker serving")
    print(f"LoRA deploy:                      {results['lora_deploy_s']:.2f}s median")
    print(f"failed requests:                  {failures} of {results['requests']} (goal 0)")
    print(f"throughput during / before:       {results['throughput_ratio_during_update']:.3f} "
          f"({results['throughput_during_update_tok_s']:.0f} vs {results['throughput_before_tok_s']:.0f} tok/s)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
