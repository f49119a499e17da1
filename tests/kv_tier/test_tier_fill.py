"""A full tier holds 3x+ the tokens with NVFP4 blocks as with lossless ones, on the real stack.

The same 32 MiB Mooncake tier, once per format, is filled through the front door with distinct long prompts on a
worker whose own KV cache is small (benchmarks/kv_tier_fill.py `fill_tier`), until Mooncake has evicted a
quarter of what it holds. The tokens held are read from the tier itself: the master's object count (one object
per 32-token block). Computed for the tiny model: 18,464-byte NVFP4 blocks in 20,480-byte slots against
65,536-byte bf16 blocks, 3.2x (engine/kv_tier/formats.py).
"""

import pytest

from benchmarks.kv_tier_fill import TierStack, fill_tier
from tests.tiny_models import trained_tiny_model

pytestmark = pytest.mark.stack

# 32 MiB: full after ~46k tokens in NVFP4, ~14k lossless. A save (47 blocks, 3 MiB lossless) must stay well under
# the room one eviction frees (5% of the capacity, on top of the 10% above the high watermark): in a 16 MiB tier
# each lossless save refilled it to 100%.
TIER_GIB = 1 / 32


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> dict[str, dict]:
    trained_tiny_model()  # what the stacks serve
    held = {}
    for nvfp4 in (True, False):
        ts = TierStack(tmp_path_factory.mktemp("fill"), nvfp4, TIER_GIB, port_start=32500)
        try:
            held[ts.name] = fill_tier(ts)
        finally:
            ts.stop()
    return held


def test_a_full_nvfp4_tier_holds_over_3x_the_tokens_of_a_lossless_one(filled):
    nvfp4, lossless = filled["nvfp4"], filled["lossless"]
    print({name: run["tokens_held"] for name, run in filled.items()})
    assert nvfp4["capacity_bytes"] == lossless["capacity_bytes"] == int(TIER_GIB * 2**30)
    assert nvfp4["tokens_held"] >= 3 * lossless["tokens_held"]


def test_a_full_tier_is_nearly_all_used_and_keeps_taking_blocks(filled):
    """Mooncake evicts past 90% of the capacity: full, the objects held fill over 80% of it. A tier whose freed
    room cannot be reused refuses most puts once full (engine/kv_tier/formats.py `slot_bytes`)."""
    for run in filled.values():
        assert run["fill_fraction"] >= 0.8
        assert run["puts_refused"] <= 0.1 * run["objects_evicted"]
