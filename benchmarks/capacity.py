"""Capacity pools, batch priority and failover, measured in one run on one stack.

The stack: the default pool (1 worker), a serverless pool `burst` (0 to 1 worker) and a pool `ha` with
two deployments (a Dynamo frontend and a worker each).
1. Cold start: a request to `burst` at zero workers, until its first token (repeated after the pool
   scaled back to zero; median).
2. Interactive latency with and without a batch job: the same interactive load (concurrent chat
   clients on the default pool) alone and while a 200-line batch runs (Batch API, low priority), in
   alternating rounds; p90 request latency of each arm.
3. A worker SIGKILLed under load in `ha`: streams run on both deployments, its worker is frozen (SIGSTOP),
   `--arriving` new requests are sent under sessions routed to the victim's deployment, and once the front door
   has sent them there the worker is killed (kill_worker_under_load, rollout_server/harness/pool_stack.py). The figures count only the requests that
   went to the killed deployment, told apart per request (served by its worker, or refused by it and failed
   over, in the front door's log): those lost that had not streamed a token (goal: 0), and the streams cut
   mid-way (they end with a retryable error event).

Run: .venv/bin/python benchmarks/capacity.py   (about 2 minutes on 2 cores)
Writes benchmarks/results/capacity.json. With --only-kill: part 3 alone (about 1 minute), printed, nothing written.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rollout_server.harness.pool_stack import (  # noqa: E402
    MODEL,
    StreamRecord,
    kill_worker_under_load,
    pools,
    start_pool_stack,
    stream,
    wait_for,
)

RESULTS = Path(__file__).parent / "results" / "capacity.json"
POOLS = """
[pools.burst]
kind = "serverless"
min_workers = 0
max_workers = 1
idle_s = 5

[pools.ha]
kind = "shared"
deployments = 2
workers = 1
"""


def cold_start_s(url: str) -> float:
    wait_for(lambda: pools(url)["burst"]["workers"] == 0, 120, "burst at zero workers")
    record = StreamRecord()
    started = time.monotonic()
    stream(url, f"{MODEL}@burst", "cold", 4, record, deadline_s=600)
    assert record.first_token_at, record
    return record.first_token_at - started


def interactive_latencies(url: str, clients: int, requests_per_client: int) -> list[float]:
    def client(i: int) -> list[float]:
        latencies = []
        for j in range(requests_per_client):
            started = time.monotonic()
            answer = httpx.post(f"{url}/v1/chat/completions", timeout=300, headers={"X-Session-ID": f"c{i}"}, json={
                "model": MODEL, "messages": [{"role": "user", "content": f"question {i}.{j}"}], "max_tokens": 32,
                "temperature": 0})
            answer.raise_for_status()
            latencies.append(time.monotonic() - started)
        return latencies

    with ThreadPoolExecutor(clients) as threads:
        return [x for one in threads.map(client, range(clients)) for x in one]


def start_batch(url: str, lines: int) -> str:
    rows = [{"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": MODEL, "messages": [{"role": "user", "content": f"offline job {i}"}], "max_tokens": 32}}
            for i in range(lines)]
    upload = httpx.post(f"{url}/v1/files", data={"purpose": "batch"}, timeout=60,
                        files={"file": ("batch.jsonl", "\n".join(map(json.dumps, rows)).encode())})
    upload.raise_for_status()
    batch = httpx.post(f"{url}/v1/batches", timeout=60, json={
        "input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    batch.raise_for_status()
    batch_id = batch.json()["id"]
    wait_for(lambda: httpx.get(f"{url}/v1/batches/{batch_id}", timeout=30).json()["request_counts"]["completed"] > 0,
             120, "the batch running", poll_s=0.2)
    return batch_id


def batch_completed(url: str, batch_id: str) -> int:
    return httpx.get(f"{url}/v1/batches/{batch_id}", timeout=30).json()["request_counts"]["completed"]


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.9 * (len(ordered) - 1))]


def worker_kill(stack, arriving: int) -> dict:
    """Part 3's figures, each over the requests the front door sent to the killed deployment."""
    wait_for(lambda: all(d["healthy"] for d in pools(stack.url)["ha"]["deployments"]), 180, "ha up")
    outcome = kill_worker_under_load(stack, f"{MODEL}@ha", arriving=arriving)
    print(f"worker kill under load on {outcome.victim}: {len(outcome.on_victim)} requests were sent there, "
          f"{len(outcome.not_started)} of them had no token yet, {len(outcome.lost)} of those lost; "
          f"{len(outcome.cut)} streams cut with an error event; {outcome.failovers} failovers")
    return {
        "requests_on_killed_deployment": len(outcome.on_victim),
        "requests_on_killed_deployment_not_started_at_kill": len(outcome.not_started),
        "lost_requests_on_worker_kill": len(outcome.lost),
        "streams_cut_on_worker_kill": len(outcome.cut),
        "failovers_on_worker_kill": outcome.failovers,
        "requests_failed_on_other_deployment": len(outcome.failed_elsewhere),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of interactive load, each arm")
    parser.add_argument("--clients", type=int, default=3, help="concurrent interactive clients")
    parser.add_argument("--requests", type=int, default=8, help="requests per client per round")
    parser.add_argument("--batch-lines", type=int, default=200)
    parser.add_argument("--arriving", type=int, default=24, help="new requests sent to the killed deployment")
    parser.add_argument("--only-kill", action="store_true", help="the worker kill alone; prints, writes nothing")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="capacity-") as tmp:
        stack, _ = start_pool_stack(Path(tmp), POOLS, deployments=3)
        try:
            if args.only_kill:
                print(json.dumps(worker_kill(stack, args.arriving), indent=1))
                return
            cold = [cold_start_s(stack.url) for _ in range(2)]
            print(f"cold start (0 workers -> first token): {', '.join(f'{c:.1f} s' for c in cold)}")

            alone, with_batch, batch_done = [], [], []
            for _ in range(args.rounds):
                alone += interactive_latencies(stack.url, args.clients, args.requests)
                batch_id = start_batch(stack.url, args.batch_lines)
                before = batch_completed(stack.url, batch_id)
                with_batch += interactive_latencies(stack.url, args.clients, args.requests)
                batch_done.append(batch_completed(stack.url, batch_id) - before)
                httpx.post(f"{stack.url}/v1/batches/{batch_id}/cancel", timeout=60).raise_for_status()
            ratio = p90(with_batch) / p90(alone)
            print(f"interactive p90: alone {p90(alone):.3f} s, with a batch running {p90(with_batch):.3f} s "
                  f"(x{ratio:.2f}); batch lines finished meanwhile: {batch_done}")

            kill = worker_kill(stack, args.arriving)
        except BaseException:
            print(stack.log_tail(60), file=sys.stderr)
            raise
        finally:
            stack.stop()

    results = {
        "cold_start_s": round(statistics.median(cold), 2),
        "cold_start_runs_s": ", ".join(f"{c:.2f}" for c in cold),
        "interactive_p90_alone_s": round(p90(alone), 4),
        "interactive_p90_with_batch_s": round(p90(with_batch), 4),
        "interactive_p90_ratio_with_batch": round(ratio, 3),
        "batch_lines_done_during_interactive_load": sum(batch_done),
        **kill,
    }
    print(json.dumps(results, indent=1))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
