"""CPU references for the KV tier's tests: tensors through the tier's block codec, and the tiny model's next
token with its prompt's KV as the tier hands it back."""

from pathlib import Path

import torch

from engine.kv_tier.blocks import BlockCodec, kernel_view

BS = 32  # tokens per block, as the tier tests' workers run


def through_the_tier(k: torch.Tensor, v: torch.Tensor, nvfp4: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V [seq, heads, head_dim] -> BF16 cache blocks -> tier objects -> back; the partial last block stays."""
    seq, heads, head_dim = k.shape
    full = seq // BS * BS
    content = torch.cat((k[:full], v[:full]), dim=-1).bfloat16()  # [tokens, heads, K|V]
    cache = content.view(full // BS, BS, heads, 2 * head_dim).permute(0, 2, 1, 3).contiguous()
    codec = BlockCodec.for_caches([cache], nvfp4)
    ids = list(range(cache.shape[0]))
    out = torch.zeros_like(cache)
    codec.write_blocks(codec.read_blocks([kernel_view(cache)], ids), [kernel_view(out)], ids)
    back = out.permute(0, 2, 1, 3).reshape(full, heads, 2 * head_dim).float()
    k2, v2 = k.bfloat16().float(), v.bfloat16().float()
    k2[:full], v2[:full] = back[..., :head_dim], back[..., head_dim:]
    return k2, v2


@torch.no_grad()
def next_token_logprobs(model_dir: Path, prompt: list[int], stored_tokens: int, nvfp4: bool) -> torch.Tensor:
    """Log-probabilities of the token after `prompt` (transformers, float32), with the KV of its first
    `stored_tokens` tokens as it comes back from the tier (BF16 blocks, NVFP4 objects when `nvfp4`) and the
    rest computed afresh, as a worker serves a prompt whose prefix it loaded."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    cache = model(ids[:, :stored_tokens], use_cache=True).past_key_values
    for layer in cache.layers:  # keys, values: [batch, heads, tokens, head_dim]
        k, v = through_the_tier(layer.keys[0].transpose(0, 1), layer.values[0].transpose(0, 1), nvfp4)
        layer.keys, layer.values = k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    logits = model(ids[:, stored_tokens:], past_key_values=cache).logits[0, -1]
    return logits.float().log_softmax(-1)
