"""Real disaggregated stacks (1 prefill + 2 decode workers, KV over NIXL) for the disagg tests.

These tests run in their own final phase of scripts/test (marker `disagg`): each NIXL worker keeps
a core busy polling UCX, which would starve the other tests' stacks.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from engine.supervisor.health import vllm_counter
from rollout_server.harness.stack import RunningStack, free_port_block, start_stack

MODEL = "tiny-qwen2"
BLOCK_SIZE = 32  # the stack's default KV block size
PREFILL_WORKERS, DECODE_WORKERS = 1, 2  # two decode workers: killing one leaves one to serve


def token_prompt(length: int, seed: int) -> list[int]:
    """A deterministic prompt of `length` token ids from the tiny model's BPE range (no special tokens)."""
    rng = random.Random(seed)
    return [rng.randrange(300, 4000) for _ in range(length)]


# Prompts whose greedy continuations are compared between an aggregated and a disaggregated stack.
GREEDY_PROMPTS = {"short": token_prompt(70, 1), "long": token_prompt(1200, 2), "odd": token_prompt(333, 3)}
GREEDY_MAX_TOKENS = 24


def complete(url: str, prompt: list[int], max_tokens: int, session: str | None = None, **extra) -> httpx.Response:
    headers = {"X-Session-ID": session} if session else {}
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "return_token_ids": True, **extra}
    # The first disaggregated request pays NIXL's handshake (~10 s here); a loaded 2-core machine more.
    return httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=300)


def reference_tokens(url: str) -> dict[str, list[int]]:
    """Greedy continuations of GREEDY_PROMPTS, and one seeded sample (the decode worker keeps the seed)."""
    out = {}
    for name, prompt in GREEDY_PROMPTS.items():
        resp = complete(url, prompt, GREEDY_MAX_TOKENS, ignore_eos=True)
        assert resp.status_code == 200, resp.text
        out[name] = resp.json()["choices"][0]["token_ids"]
    resp = complete(url, GREEDY_PROMPTS["odd"], GREEDY_MAX_TOKENS, ignore_eos=True, temperature=1.0, seed=7)
    assert resp.status_code == 200, resp.text
    out["seeded"] = resp.json()["choices"][0]["token_ids"]
    return out


# The first cold prompt a fresh disaggregated stack serves: stacks that differ only in KV layout allocate the same
# blocks for it, so its NIXL transfer moves the same bytes in the same runs of blocks.
PROBE_PROMPT = token_prompt(1500, 9)
NIXL_COUNTERS = {"transfers": "vllm:nixl_xfer_time_seconds_count", "seconds": "vllm:nixl_xfer_time_seconds_sum",
                 "descriptors": "vllm:nixl_num_descriptors_sum", "bytes": "vllm:nixl_bytes_transferred_sum"}


@dataclass(frozen=True)
class ProbeTransfer:
    """The probe's greedy tokens and its KV transfer as the decode workers' NIXL telemetry counted it."""
    tokens: list[int]
    transfers: float
    descriptors: float
    bytes: float


def nixl_totals(decode_ports: list[int]) -> dict[str, float]:
    """vLLM's NIXL transfer telemetry (vllm:nixl_* histograms' counts and sums) over the decode workers."""
    return {key: sum(vllm_counter(port, name) for port in decode_ports) for key, name in NIXL_COUNTERS.items()}


def probe_transfer(url: str, decode_ports: list[int]) -> ProbeTransfer:
    before = nixl_totals(decode_ports)
    resp = complete(url, PROBE_PROMPT, GREEDY_MAX_TOKENS, ignore_eos=True)
    assert resp.status_code == 200, resp.text
    deadline = time.monotonic() + 30  # the telemetry reaches /metrics with the engine's next stats update
    while (after := nixl_totals(decode_ports))["transfers"] == before["transfers"] and time.monotonic() < deadline:
        time.sleep(0.5)
    delta = {key: after[key] - before[key] for key in after}
    return ProbeTransfer(resp.json()["choices"][0]["token_ids"], delta["transfers"], delta["descriptors"],
                         delta["bytes"])


@dataclass
class WorkerPorts:
    role: str
    system_port: int
    kv_events_port: int


@dataclass
class DisaggStack:
    running: RunningStack
    workers: list[WorkerPorts]
    first_transfer: ProbeTransfer  # PROBE_PROMPT, served first

    @property
    def url(self) -> str:
        return self.running.url

    def ports(self, role: str) -> list[int]:
        return [w.system_port for w in self.workers if w.role == role]

    def kv_events_ports(self, role: str) -> list[int]:
        return [w.kv_events_port for w in self.workers if w.role == role]


def prompt_tokens_by_source(stack: DisaggStack, role: str) -> dict[str, float]:
    """vLLM's prompt-token accounting summed over the workers of `role`:
    local_compute (prefilled here), local_cache_hit (this worker's prefix cache), external_kv_transfer (NIXL)."""
    return {source: sum(vllm_counter(port, "vllm:prompt_tokens_by_source_total", source=source) for port in stack.ports(role))
            for source in ("local_compute", "local_cache_hit", "external_kv_transfer")}


@pytest.fixture(scope="session")
def aggregated_reference(tmp_path_factory) -> dict[str, list[int]]:
    """reference_tokens() from a 1-worker aggregated stack, stopped before the disaggregated one starts."""
    stack = start_stack(tmp_path_factory.mktemp("aggregated"), workers=1,
                        extra_env={"ROLLOUT_SERVE_TRACES__ENABLED": "false"})
    try:
        return reference_tokens(stack.url)
    finally:
        stack.stop()


def start_disagg_stack(tmp: Path, prefill: int, decode: int, env: dict[str, str] | None = None) -> RunningStack:
    total = prefill + decode
    return start_stack(
        tmp, workers=total,  # reserves system and KV-event ports for `total` workers
        extra_args=["--prefill-workers", str(prefill), "--decode-workers", str(decode),
                    "--nixl-side-channel-base-port", str(free_port_block(total, start=31500))],
        extra_env={"ROLLOUT_SERVE_TRACES__ENABLED": "false", **(env or {})}, timeout_s=600)


@pytest.fixture(scope="session")
def layer_major_transfer(tmp_path_factory, aggregated_reference) -> ProbeTransfer:
    """probe_transfer() on a fresh 1 prefill + 1 decode stack in vLLM's layer-major KV layout (LBHNC), stopped
    before the (block-major, the default) disaggregated stack starts."""
    running = start_disagg_stack(tmp_path_factory.mktemp("layer-major"), 1, 1,
                                 {"ROLLOUT_SERVE_ENGINE__DISAGGREGATION__KV_LAYOUT": "LBHNC"})
    try:
        return probe_transfer(running.url, [running.worker_system_port(1)])
    finally:
        running.stop()


@pytest.fixture(scope="session")
def disagg_stack(tmp_path_factory, aggregated_reference, layer_major_transfer) -> DisaggStack:
    total = PREFILL_WORKERS + DECODE_WORKERS
    running = start_disagg_stack(tmp_path_factory.mktemp("disagg"), PREFILL_WORKERS, DECODE_WORKERS)
    roles = ["prefill"] * PREFILL_WORKERS + ["decode"] * DECODE_WORKERS
    # start_stack's port layout: worker i's KV events port comes `total` ports after its system port
    workers = [WorkerPorts(role, running.worker_system_port(i), running.worker_system_port(i) + total)
               for i, role in enumerate(roles)]
    first = probe_transfer(running.url, [w.system_port for w in workers if w.role == "decode"])
    yield DisaggStack(running, workers, first)
    running.stop()
