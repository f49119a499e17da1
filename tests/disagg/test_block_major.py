"""Block-major (BLHNC) KV on the prefill/decode path, counted by NIXL itself.

The same probe prompt is the first cold prompt of two fresh disaggregated stacks that differ only in KV layout:
vLLM's layer-major default (LBHNC) and ours (BLHNC, the default; engine/worker/block_major_kv.py). Both
allocate the same blocks for it, so NIXL moves the same bytes in the same runs of blocks; the descriptors it
counts per transfer (vLLM's `vllm:nixl_num_descriptors`, from NIXL's transfer telemetry) differ by the layer
count: layer-major needs one per layer for each run of blocks, block-major one.
"""

import json

import pytest

from tests.tiny_models import trained_tiny_model

pytestmark = [pytest.mark.disagg, pytest.mark.stack, pytest.mark.timeout(1500)]


def test_block_major_transfers_move_every_layer_of_a_block_in_one_descriptor(disagg_stack, layer_major_transfer):
    layers = json.loads((trained_tiny_model() / "config.json").read_text())["num_hidden_layers"]
    block_major = disagg_stack.first_transfer
    assert layer_major_transfer.transfers == block_major.transfers == 1
    assert layer_major_transfer.bytes == block_major.bytes > 0
    assert layer_major_transfer.descriptors == layers * block_major.descriptors
    # ... and what the decode worker then generates does not depend on the layout.
    assert block_major.tokens == layer_major_transfer.tokens
