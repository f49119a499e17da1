"""The KV tier on the real stack: one vLLM worker with a small KV cache, Mooncake master + holder.

A long prompt is served, then enough other long prompts to evict it from the worker's prefix
cache; served again, its blocks come back from the tier. The workers run bfloat16, so the tiny
model's KV is 4 layers x 2 KV heads x (K, V) x 64 dims x 2 bytes = 2 KiB per token, 64 KiB per
32-token block.
"""

import math
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch

from engine.kv_tier.policy import write_policy_version
from engine.kv_tier.settings import KvTierSettings
from engine.supervisor import kv_tier_service
from rollout_server.harness.checkpoints import rewrite_adapter, write_lora_adapter
from rollout_server.harness.stack import CACHE_DIR, RunningStack, free_port_block, start_stack
from rollout_server.settings import Settings
from rollout_server.tiny_model.builder import resolve_model
from tests.kv_tier.tier_reference import next_token_logprobs
from tests.tiny_models import trained_tiny_model

pytestmark = pytest.mark.stack

BLOCK = 32
KV_BYTES_PER_TOKEN = 4 * 2 * 2 * 64 * 2
CACHE_BLOCKS = 96  # the worker's whole KV cache
KV_CACHE_GIB = CACHE_BLOCKS * BLOCK * KV_BYTES_PER_TOKEN / 2**30  # 6 MiB
MAX_MODEL_LEN = 2048
PROMPT_TOKENS = 30 * BLOCK + 7
LOADABLE_BLOCKS = (PROMPT_TOKENS - 1) // BLOCK  # vLLM always computes a prompt's last token
FILLERS = 4  # 4 x 31 blocks after the prompt's 31: more than the 96-block cache, so the prompt is evicted
MAX_TOKENS = 12


@dataclass
class TierStack:
    stack: RunningStack
    tier: KvTierSettings
    nvfp4: bool

    @property
    def version_file(self) -> Path:
        return next(self.stack.state_dir.glob("stack-*/kv-tier/policy-version.worker-0"))

    def metrics(self) -> kv_tier_service.TierMetrics:
        return kv_tier_service.read_metrics(self.tier)


@dataclass
class Completion:
    token_ids: list[int]
    top_logprobs: list[dict[str, float]]
    cached_tokens: int


@pytest.fixture(scope="module", params=["lossless", "nvfp4"])
def tier_stack(request, tmp_path_factory):
    nvfp4 = request.param == "nvfp4"
    tier = KvTierSettings(enabled=True, capacity_gib=0.25, nvfp4=nvfp4, port_base=free_port_block(3, start=32300))
    stack = start_stack(
        tmp_path_factory.mktemp(f"tier-{request.param}"), workers=1,
        extra_args=["--kv-cache-gib", repr(KV_CACHE_GIB), "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "bfloat16",
                    "--enable-lora"],
        extra_env=tier.as_env())
    yield TierStack(stack, tier, nvfp4)
    stack.stop()


def tokens(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 4000) for _ in range(PROMPT_TOKENS)]


def complete(ts: TierStack, prompt: list[int], model: str | None = None) -> Completion:
    response = httpx.post(f"{ts.stack.url}/v1/completions", timeout=120, json={
        "model": model or ts.stack.model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
        "logprobs": 5, "return_tokens_as_token_ids": True, "return_token_ids": True})
    assert response.status_code == 200, response.text
    body = response.json()
    choice = body["choices"][0]
    return Completion(choice["token_ids"], choice["logprobs"]["top_logprobs"],
                      body["usage"]["prompt_tokens_details"]["cached_tokens"])


def serve_and_wait_saved(ts: TierStack, prompt: list[int], model: str | None = None) -> Completion:
    """Serves `prompt`; returns once its blocks are in the tier (saved in the step after it finishes)."""
    keys_before = ts.metrics().keys
    result = complete(ts, prompt, model)
    deadline = time.monotonic() + 30
    while ts.metrics().keys < keys_before + LOADABLE_BLOCKS:
        assert time.monotonic() < deadline, f"blocks not saved: {ts.metrics()}\n{ts.stack.log_tail()}"
        time.sleep(0.2)
    return result


def evict(ts: TierStack, first_seed: int) -> None:
    for seed in range(first_seed, first_seed + FILLERS):
        complete(ts, tokens(seed))


def served_from_tier(ts: TierStack, prompt: list[int], model: str | None = None) -> tuple[Completion, int]:
    """Serves `prompt`; returns the completion and how many objects the tier handed out meanwhile."""
    before = ts.metrics().get_requests
    result = complete(ts, prompt, model)
    return result, ts.metrics().get_requests - before


def test_tier_is_up_with_the_configured_capacity(tier_stack):
    assert tier_stack.metrics().capacity_bytes == tier_stack.tier.capacity_bytes
    assert "KV tier:" in tier_stack.stack.log_tail(400) and "tokens in" in tier_stack.stack.log_tail(400)


def test_an_evicted_prefix_is_loaded_back_from_the_tier(tier_stack):
    prompt = tokens(seed=1)
    cold = serve_and_wait_saved(tier_stack, prompt)
    assert cold.cached_tokens == 0
    evict(tier_stack, first_seed=100)

    warm, objects_read = served_from_tier(tier_stack, prompt)

    assert objects_read == LOADABLE_BLOCKS  # every block came from the tier: the worker had evicted them all
    assert warm.cached_tokens == LOADABLE_BLOCKS * BLOCK
    if not tier_stack.nvfp4:
        assert warm.token_ids == cold.token_ids
        for w, c in zip(warm.top_logprobs, cold.top_logprobs):
            assert w.keys() == c.keys()
            assert all(abs(w[t] - c[t]) < 1e-3 for t in c)
    else:
        assert_first_token_as_the_reference(prompt, cold, warm)


# The workers compute in bfloat16, the reference in float32: without the tier, the first token's top-5
# probabilities agree within ~0.005. How far NVFP4 KV moves them depends on the weights and on the CPU's bfloat16
# kernels: the NVFP4 rounding of each value follows the prefix's KV to the last bit, so the engine's kernels
# (AVX2-emulated or AMX bfloat16) and the reference's round different values one way or the other. On AVX2 cores
# the reference reproduced the served shift within this tolerance; on an AMX Xeon the served shift was 0.015
# where the reference's was 0.049. So the served answer is held to what NVFP4 can do (test_nvfp4_accuracy.py
# bounds the KV error itself): its first token is the reference's, it moved (the NVFP4 blocks were used), and by
# no more than the reference's NVFP4 shift.
REFERENCE_TOLERANCE = 0.015  # probability


def assert_first_token_as_the_reference(prompt: list[int], cold: Completion, warm: Completion) -> None:
    """NVFP4 KV is lossy: the first token after the loaded prefix is what the CPU reference predicts with the
    prefix's KV through the tier's NVFP4 codec; the cold one what it predicts without the tier."""
    model_dir, _ = resolve_model(Settings(cache_dir=CACHE_DIR))
    stored = LOADABLE_BLOCKS * BLOCK
    lossless = next_token_logprobs(model_dir, prompt, stored, nvfp4=False).exp()
    nvfp4 = next_token_logprobs(model_dir, prompt, stored, nvfp4=True).exp()
    served_cold, served_warm = first_token_probs(cold), first_token_probs(warm)
    cold_gap, warm_gap = gap(served_cold, lossless), gap(served_warm, nvfp4)
    nvfp4_effect = gap({t: nvfp4[t].item() for t in served_warm}, lossless)
    print(f"first-token top-5 probabilities minus the reference's: cold {cold_gap:.4f}, through the NVFP4 tier "
          f"{warm_gap:.4f}; NVFP4 moves the reference's by {nvfp4_effect:.4f}")
    assert cold.token_ids[0] == lossless.argmax().item() and warm.token_ids[0] == nvfp4.argmax().item()
    assert cold_gap < REFERENCE_TOLERANCE
    served_shift = max(abs(p - served_cold[t]) for t, p in served_warm.items() if t in served_cold)
    assert served_shift > 1e-3, "the answer through the tier is the cold one: the NVFP4 blocks were not used"
    assert gap(served_warm, lossless) < nvfp4_effect + REFERENCE_TOLERANCE


def first_token_probs(served: Completion) -> dict[int, float]:
    return {int(t.removeprefix("token_id:")): math.exp(lp) for t, lp in served.top_logprobs[0].items()}


def gap(probs: dict[int, float], reference: torch.Tensor) -> float:
    """The largest difference between the tokens' probabilities and the reference's."""
    return max(abs(p - reference[t].item()) for t, p in probs.items())


def test_after_a_policy_version_change_nothing_is_loaded_from_the_tier(tier_stack):
    prompt = tokens(seed=2)
    serve_and_wait_saved(tier_stack, prompt)  # saved under version 0
    write_policy_version(tier_stack.version_file, 1)  # what a live weight update does
    try:
        evict(tier_stack, first_seed=200)
        under_new_version, objects_read = served_from_tier(tier_stack, prompt)
        assert objects_read == 0
        assert under_new_version.cached_tokens == 0
    finally:
        write_policy_version(tier_stack.version_file, 0)
    # Control: back on version 0, the same prompt's version-0 blocks load again.
    evict(tier_stack, first_seed=300)
    again, objects_read = served_from_tier(tier_stack, prompt)
    assert objects_read == LOADABLE_BLOCKS
    assert again.cached_tokens == LOADABLE_BLOCKS * BLOCK


def deploy_adapter(ts: TierStack, directory: Path, name: str) -> None:
    response = httpx.post(f"{ts.stack.url}/v1/admin/deployments", timeout=300,
                          json={"path": str(directory), "name": name, "wait": True})
    assert response.status_code == 200, response.text


def test_an_adapter_deployed_again_under_its_name_never_reads_its_old_kv(tier_stack, tmp_path):
    """A trainer's next step of a LoRA adapter, deployed under the same name from the same directory: its
    prompt's KV of the previous step (in the worker's prefix cache and in the tier) is not read, and it answers
    as a fresh deploy of the same weights does."""
    adapter = write_lora_adapter(tmp_path / "coder", trained_tiny_model())

    def new_weights(seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        rewrite_adapter(adapter, lambda tensors: tensors.update(
            {name: torch.randn(t.shape, generator=generator) * 0.5 for name, t in tensors.items()}))

    prompt = tokens(seed=3)
    new_weights(1)
    deploy_adapter(tier_stack, adapter, "coder")
    step_1 = serve_and_wait_saved(tier_stack, prompt, "coder")
    new_weights(2)
    deploy_adapter(tier_stack, adapter, "coder")
    step_2, objects_read = served_from_tier(tier_stack, prompt, "coder")
    assert (step_2.cached_tokens, objects_read) == (0, 0)

    fresh = shutil.copytree(adapter, tmp_path / "coder-fresh")
    deploy_adapter(tier_stack, fresh, "coder-fresh")
    assert complete(tier_stack, prompt, "coder-fresh").token_ids == step_2.token_ids != step_1.token_ids
