"""KV formats benchmark: sizes, NVFP4 attention accuracy on the tiny model, transfer descriptors and
NIXL loopback transfer time of layer-major vs BLHNC. Runs on CPU in about a minute.

    .venv/bin/python benchmarks/kv_formats.py

Prints a report and writes one flat JSON object to benchmarks/results/kv_formats.json.
"""

import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("UCX_NET_DEVICES", "lo")  # NIXL/UCX host-memory loopback; UCX_TLS left alone

import numpy as np
import torch

from kernels import attention, fp8, layouts, mla_codec, page_codec

RESULTS = Path(__file__).parent / "results" / "kv_formats.json"
GIB = 1 << 30
BLOCK_SIZE = 64
REQUEST_TOKENS = 200_000
PRODUCTION_LAYERS = 61  # DeepSeek-V3 / GLM class MLA model, 576-byte FP8 rows
TRANSFER_SCALE = 16  # the timed transfer moves 1/16 of the 200k-token request (RAM and time here)
QUERY_ROWS = 128  # decode-style queries: the last 128 positions of the text, each attending causally

TEXT = (
    "The scheduler keeps a queue of requests and a pool of cache blocks. Each step it picks the requests "
    "that fit, runs one forward pass, samples the next token of every sequence, and frees the blocks of "
    "finished ones. def read_config(path):\n    with open(path) as f:\n        return json.load(f)\n"
    "When memory runs short the newest request is preempted and its blocks return to the free list. "
    "A user asks for the weather in Paris; the assistant calls a tool, reads the result, and answers. "
    "Tokens stream back to the client as they are produced, and the trainer reads their log probabilities. "
) * 6


# ---------------------------------------------------------------- sizes

def size_report(tiny_config) -> dict:
    kv_heads = tiny_config.num_key_value_heads
    head_dim = getattr(tiny_config, "head_dim", None) or tiny_config.hidden_size // tiny_config.num_attention_heads
    layers = tiny_config.num_hidden_layers
    out = {}
    for fmt in ("bf16", "fp8", "nvfp4"):
        gqa = page_codec.bytes_per_token(kv_heads, head_dim, fmt)
        mla = mla_codec.bytes_per_token(fmt)
        out[f"gqa_bytes_per_token_layer_{fmt}"] = gqa
        out[f"gqa_tokens_per_gib_{fmt}"] = GIB // (gqa * layers)
        out[f"mla_row_bytes_{fmt}"] = mla
        out[f"mla_tokens_per_gib_{fmt}"] = GIB // (mla * PRODUCTION_LAYERS)
    out["gqa_bytes_ratio_bf16_over_nvfp4"] = out["gqa_bytes_per_token_layer_bf16"] / out["gqa_bytes_per_token_layer_nvfp4"]
    out["mla_bytes_ratio_fp8_over_nvfp4"] = out["mla_row_bytes_fp8"] / out["mla_row_bytes_nvfp4"]
    return out


# ---------------------------------------------------------------- accuracy on real activations

@dataclass
class LayerActivations:
    q: torch.Tensor  # [seq, q_heads, head_dim], after RoPE
    k: torch.Tensor  # [seq, kv_heads, head_dim], after RoPE
    v: torch.Tensor  # [seq, kv_heads, head_dim]


def capture_activations(model_dir: Path) -> list[LayerActivations]:
    """Runs the tiny model on TEXT and recomputes each layer's Q, K, V from its attention inputs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    captured: list[LayerActivations] = []

    def hook(attn, args, kwargs, _output):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        cos, sin = kwargs["position_embeddings"]
        shape = (*hidden.shape[:-1], -1, attn.head_dim)
        q = attn.q_proj(hidden).view(shape).transpose(1, 2)
        k = attn.k_proj(hidden).view(shape).transpose(1, 2)
        v = attn.v_proj(hidden).view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        captured.append(LayerActivations(*(t[0].transpose(0, 1).detach() for t in (q, k, v))))

    handles = [layer.self_attn.register_forward_hook(hook, with_kwargs=True) for layer in model.model.layers]
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        model(ids)
    for handle in handles:
        handle.remove()
    return captured


def attention_rows(q, k, v, sm_scale):
    """Causal decode-style attention of the last QUERY_ROWS positions: outputs and argmax key per head."""
    outputs, top1 = [], []
    seq = q.shape[0]
    for pos in range(seq - QUERY_ROWS, seq):
        out, weights = attention.attend(q[pos], k[: pos + 1], v[: pos + 1], sm_scale)
        outputs.append(out)
        top1.append(weights.argmax(dim=-1))
    return torch.stack(outputs), torch.stack(top1)


def accuracy_report(layers: list[LayerActivations]) -> dict:
    """NVFP4 (and FP8) KV against BF16 KV, same FP32 attention math; per-layer scales calibrated on the text."""
    def bf16(k, v):
        return k.bfloat16().float(), v.bfloat16().float()

    def nvfp4_kv(k, v):
        scales = page_codec.PageScales.calibrate(k, v)
        return (page_codec.decode_heads(page_codec.encode_heads(k, scales.k_global_scale), scales.k_global_scale),
                page_codec.decode_heads(page_codec.encode_heads(v, scales.v_global_scale), scales.v_global_scale))

    def fp8_kv(k, v):
        ks, vs = fp8.fp8_scale_for(k), fp8.fp8_scale_for(v)
        return fp8.fp8_dequantize(fp8.fp8_quantize(k, ks), ks), fp8.fp8_dequantize(fp8.fp8_quantize(v, vs), vs)

    totals = {name: {"err": 0.0, "agree": 0, "rows": 0} for name in ("nvfp4", "fp8")}
    base_norm = 0.0
    for layer in layers:
        sm_scale = 1 / math.sqrt(layer.q.shape[-1])
        base_out, base_top1 = attention_rows(layer.q, *bf16(layer.k, layer.v), sm_scale)
        base_norm += base_out.pow(2).sum().item()
        for name, codec in (("nvfp4", nvfp4_kv), ("fp8", fp8_kv)):
            out, top1 = attention_rows(layer.q, *codec(layer.k, layer.v), sm_scale)
            totals[name]["err"] += (out - base_out).pow(2).sum().item()
            totals[name]["agree"] += int((top1 == base_top1).sum())
            totals[name]["rows"] += top1.numel()
    report = {}
    for name, t in totals.items():
        report[f"attn_rel_error_{name}"] = math.sqrt(t["err"] / base_norm)
        report[f"top1_agreement_{name}"] = t["agree"] / t["rows"]
    report["accuracy_query_rows"] = totals["nvfp4"]["rows"]
    report["accuracy_context_tokens"] = layers[0].q.shape[0]
    return report


# ---------------------------------------------------------------- descriptors

def fragmented_block_ids(num_blocks: int, pool_blocks: int, seed: int = 0) -> list[int]:
    """A request's block ids in a pool after churn: a random subset, handed out in ascending order."""
    generator = torch.Generator().manual_seed(seed)
    return sorted(torch.randperm(pool_blocks, generator=generator)[:num_blocks].tolist())


def descriptor_report(tiny_layers: int) -> dict:
    blocks = math.ceil(REQUEST_TOKENS / BLOCK_SIZE)
    block_ids = fragmented_block_ids(blocks, 2 * blocks)
    runs = len(layouts.block_runs(block_ids))
    report = {"request_tokens": REQUEST_TOKENS, "request_blocks": blocks, "request_block_runs": runs}
    for name, num_layers in (("production", PRODUCTION_LAYERS), ("tiny", tiny_layers)):
        layer_major = len(layouts.layer_major_regions(num_layers, 1, block_ids))
        blhnc = len(layouts.blhnc_regions(num_layers, block_ids))
        report[f"descriptors_layer_major_{name}"] = layer_major
        report[f"descriptors_blhnc_{name}"] = blhnc
    report["descriptor_ratio_layer_major_over_blhnc"] = (
        report["descriptors_layer_major_production"] / report["descriptors_blhnc_production"]
    )
    report["descriptor_ratio_layer_major_over_blhnc_tiny"] = report["descriptors_layer_major_tiny"] / report["descriptors_blhnc_tiny"]
    return report


# ---------------------------------------------------------------- NIXL transfer

class LoopbackTransfer:
    """Two NIXL agents in this process moving host memory over UCX loopback."""

    def __init__(self):
        from nixl._api import nixl_agent, nixl_agent_config

        self.source = nixl_agent("kv-source", nixl_agent_config(backends=["UCX"]))
        self.target = nixl_agent("kv-target", nixl_agent_config(backends=["UCX"]))
        self.source.add_remote_agent(self.target.get_agent_metadata())

    def register(self, source_buffers: list[torch.Tensor], target_buffers: list[torch.Tensor]) -> None:
        self.source.register_memory(source_buffers)
        self.target.register_memory(target_buffers)
        self.source.add_remote_agent(self.target.get_agent_metadata())  # refresh: new registrations

    def prepare_write(self, regions, source_buffers, target_buffers):
        """A reusable WRITE of `regions` from source to target buffers (same offsets on both sides)."""
        def descs(buffers):
            rows = [(buffers[r.buffer_index].data_ptr() + r.offset, r.length, 0) for r in regions]
            return self.source.get_xfer_descs(np.array(rows, dtype=np.uint64), "DRAM")

        return self.source.initialize_xfer("WRITE", descs(source_buffers), descs(target_buffers), "kv-target")

    def run(self, handle) -> float:
        """Posts a prepared transfer, waits for it; returns seconds."""
        start = time.perf_counter()
        state = self.source.transfer(handle)
        while state == "PROC":
            state = self.source.check_xfer_state(handle)
        if state != "DONE":
            raise RuntimeError(f"NIXL transfer ended in state {state}")
        return time.perf_counter() - start


def transfer_report(rounds: int = 5) -> dict:
    """Times moving a scaled-down production request (61 layers of 576-byte rows) in both layouts.
    The two layouts alternate, round after round, so machine noise hits both alike; medians reported."""
    tokens = REQUEST_TOKENS // TRANSFER_SCALE
    blocks = math.ceil(tokens / BLOCK_SIZE)
    pool_blocks = 2 * blocks
    block_ids = fragmented_block_ids(blocks, pool_blocks, seed=1)
    layer_block_bytes = BLOCK_SIZE * mla_codec.FP8_ROW_BYTES

    def buffers(count: int, nbytes: int, fill: int) -> list[torch.Tensor]:
        return [torch.full((nbytes,), fill, dtype=torch.uint8) for _ in range(count)]  # pages touched up front

    # Layer-major: one cache tensor per layer on each side. BLHNC: one pool, a block holding all layers.
    pools = {
        "layer_major": (buffers(PRODUCTION_LAYERS, pool_blocks * layer_block_bytes, 1),
                        buffers(PRODUCTION_LAYERS, pool_blocks * layer_block_bytes, 0),
                        layouts.layer_major_regions(PRODUCTION_LAYERS, layer_block_bytes, block_ids)),
        "blhnc": (buffers(1, pool_blocks * PRODUCTION_LAYERS * layer_block_bytes, 1),
                  buffers(1, pool_blocks * PRODUCTION_LAYERS * layer_block_bytes, 0),
                  layouts.blhnc_regions(PRODUCTION_LAYERS * layer_block_bytes, block_ids)),
    }
    transfer = LoopbackTransfer()
    transfer.register([b for source, _, _ in pools.values() for b in source],
                      [b for _, target, _ in pools.values() for b in target])
    handles = {name: transfer.prepare_write(regions, source, target) for name, (source, target, regions) in pools.items()}
    seconds = {name: [] for name in pools}
    for round_ in range(rounds + 1):  # round 0 warms up
        for name, handle in handles.items():
            elapsed = transfer.run(handle)
            if round_:
                seconds[name].append(elapsed)
    for name, (source, target, regions) in pools.items():
        moved = all(bool(t[r.offset : r.offset + r.length].eq(1).all()) for r in regions[:50] for t in [target[r.buffer_index]])
        assert moved, f"{name} transfer did not move the data"

    report = {"transfer_tokens": tokens, "transfer_bytes": blocks * PRODUCTION_LAYERS * layer_block_bytes}
    for name, (_, _, regions) in pools.items():
        report[f"transfer_descriptors_{name}"] = len(regions)
        report[f"transfer_seconds_{name}"] = statistics.median(seconds[name])
        report[f"transfer_gib_per_s_{name}"] = report["transfer_bytes"] / GIB / report[f"transfer_seconds_{name}"]
    report["transfer_speedup_blhnc"] = report["transfer_seconds_layer_major"] / report["transfer_seconds_blhnc"]
    return report


# ---------------------------------------------------------------- main

def main() -> None:
    from transformers import AutoConfig

    from rollout_server.tiny_model import ensure_tiny_model

    started = time.perf_counter()
    model_dir = ensure_tiny_model()
    config = AutoConfig.from_pretrained(model_dir)
    results = {}
    results.update(size_report(config))
    results.update(accuracy_report(capture_activations(model_dir)))
    results.update(descriptor_report(config.num_hidden_layers))
    results.update(transfer_report())
    results["runtime_seconds"] = time.perf_counter() - started
    print_report(results, config)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


def print_report(r: dict, config) -> None:
    head_dim = config.hidden_size // config.num_attention_heads
    print("== bytes per token per layer, tokens per GiB of KV (all layers)")
    print(f"   GQA tiny Qwen2 ({config.num_key_value_heads} KV heads x {head_dim}, {config.num_hidden_layers} layers)"
          f" | MLA ({PRODUCTION_LAYERS} layers, 512 latent + 64 RoPE)")
    for fmt in ("bf16", "fp8", "nvfp4"):
        print(f"   {fmt:6s} GQA {r[f'gqa_bytes_per_token_layer_{fmt}']:5d} B  {r[f'gqa_tokens_per_gib_{fmt}']:>10,d} tok/GiB"
              f" | MLA {r[f'mla_row_bytes_{fmt}']:5d} B  {r[f'mla_tokens_per_gib_{fmt}']:>8,d} tok/GiB")
    print(f"   GQA bf16/nvfp4 bytes: {r['gqa_bytes_ratio_bf16_over_nvfp4']:.2f}x; MLA fp8/nvfp4: {r['mla_bytes_ratio_fp8_over_nvfp4']:.2f}x")
    print(f"== attention vs BF16 KV, tiny model on real text ({r['accuracy_context_tokens']} tokens, "
          f"{r['accuracy_query_rows']} (layer, query, head) rows)")
    for fmt in ("nvfp4", "fp8"):
        print(f"   {fmt:6s} relative output error {r[f'attn_rel_error_{fmt}']:.4f}   top-1 key agreement {r[f'top1_agreement_{fmt}']:.3f}")
    print(f"== transfer descriptors, {r['request_tokens']:,}-token request, block size {BLOCK_SIZE} "
          f"({r['request_blocks']} blocks in {r['request_block_runs']} runs of adjacent ids)")
    for name in ("production", "tiny"):
        print(f"   {name:10s} layer-major {r[f'descriptors_layer_major_{name}']:>7,d}   BLHNC {r[f'descriptors_blhnc_{name}']:>5,d}")
    print(f"== NIXL DRAM loopback (UCX), production shape scaled to {r['transfer_tokens']:,} tokens "
          f"(1/{TRANSFER_SCALE} of the request, {r['transfer_bytes'] / GIB:.2f} GiB)")
    for layout in ("layer_major", "blhnc"):
        print(f"   {layout:11s} {r[f'transfer_descriptors_{layout}']:>6,d} descriptors  "
              f"{r[f'transfer_seconds_{layout}'] * 1e3:8.1f} ms  {r[f'transfer_gib_per_s_{layout}']:.2f} GiB/s")
    print(f"   BLHNC speed-up {r['transfer_speedup_blhnc']:.2f}x   (run took {r['runtime_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
