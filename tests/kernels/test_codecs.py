"""MLA row codec (352 bytes a token) and GQA/MHA page codec."""

import pytest
import torch

from kernels import mla_codec, nvfp4, page_codec
from kernels.fp8 import decode_e4m3


def mla_sample(tokens: int = 40, seed: int = 0):
    torch.manual_seed(seed)
    return torch.randn(tokens, 512), torch.randn(tokens, 64) * 3


def test_mla_row_is_352_bytes_against_576_for_fp8():
    latent, rope = mla_sample()
    rows = mla_codec.encode_rows(latent, rope, mla_codec.MlaScales.calibrate(latent, rope))
    assert rows.dtype == torch.uint8 and rows.shape == (40, 352)
    assert mla_codec.ROW_BYTES == 256 + 32 + 64 == 352
    assert mla_codec.bytes_per_token("nvfp4") == 352
    assert mla_codec.bytes_per_token("fp8") == 576
    assert mla_codec.bytes_per_token("bf16") == 1152


def test_mla_row_sections_hold_nvfp4_latent_then_scales_then_fp8_rope():
    latent, rope = mla_sample()
    scales = mla_codec.MlaScales.calibrate(latent, rope)
    rows = mla_codec.encode_rows(latent, rope, scales)
    q = nvfp4.quantize(latent, scales.latent_global_scale)
    assert torch.equal(rows[:, :256], q.packed)
    assert torch.equal(rows[:, 256:288], q.block_scales)
    assert torch.allclose(decode_e4m3(rows[:, 288:]) * scales.rope_scale, rope, rtol=2**-3)


def test_mla_rows_round_trip():
    latent, rope = mla_sample()
    scales = mla_codec.MlaScales.calibrate(latent, rope)
    rows = mla_codec.encode_rows(latent, rope, scales)
    latent_back, rope_back = mla_codec.decode_rows(rows, scales)
    assert torch.equal(mla_codec.encode_rows(latent_back, rope_back, scales), rows)  # bytes are a fixpoint
    assert (latent_back - latent).norm() / latent.norm() < 0.12  # NVFP4 on Gaussian data: about 0.09
    assert (rope_back - rope).norm() / rope.norm() < 0.04  # E4M3: about 0.02


def test_mla_codec_rejects_wrong_shapes():
    with pytest.raises(ValueError, match="latent"):
        mla_codec.encode_rows(torch.randn(2, 256), torch.randn(2, 64), mla_codec.MlaScales(1.0, 1.0))
    with pytest.raises(ValueError, match="352"):
        mla_codec.decode_rows(torch.zeros(2, 576, dtype=torch.uint8), mla_codec.MlaScales(1.0, 1.0))
    with pytest.raises(ValueError, match="unknown KV format"):
        mla_codec.bytes_per_token("int4")


def test_page_codec_keeps_vllm_cache_shape_with_byte_rows():
    torch.manual_seed(0)
    cache = torch.randn(6, 2, 32, 2, 64, dtype=torch.bfloat16)  # tiny Qwen2: 2 KV heads of 64 dims
    scales = page_codec.PageScales.calibrate(cache[:, 0], cache[:, 1])
    pages = page_codec.encode_kv_cache(cache, scales)
    assert pages.shape == (6, 2, 32, 2, 36) and pages.dtype == torch.uint8  # 32 + 4 bytes a head
    back = page_codec.decode_kv_cache(pages, scales, torch.bfloat16)
    assert back.shape == cache.shape and back.dtype == torch.bfloat16
    assert torch.equal(page_codec.encode_kv_cache(back, scales), pages)
    assert ((back.float() - cache.float()).norm() / cache.float().norm()).item() < 0.12


def test_page_codec_k_and_v_use_their_own_scales():
    cache = torch.ones(1, 2, 16, 1, 32)
    cache[:, 1] *= 100
    scales = page_codec.PageScales.calibrate(cache[:, 0], cache[:, 1])
    assert scales.k_global_scale == pytest.approx(100 * scales.v_global_scale)
    back = page_codec.decode_kv_cache(page_codec.encode_kv_cache(cache, scales), scales)
    assert torch.allclose(back, cache, rtol=1e-6, atol=0)  # block maxima decode exactly up to FP32 rounding


def test_bytes_per_token_for_gqa():
    assert page_codec.bytes_per_token(2, 64, "bf16") == 512
    assert page_codec.bytes_per_token(2, 64, "fp8") == 256
    assert page_codec.bytes_per_token(2, 64, "nvfp4") == 144
    assert page_codec.bytes_per_token(8, 128, "nvfp4") == 8 * 2 * 72


def test_page_codec_rejects_bad_input():
    with pytest.raises(ValueError, match="multiple of 16"):
        page_codec.row_bytes(40)
    with pytest.raises(ValueError, match="paged KV cache"):
        page_codec.encode_kv_cache(torch.randn(4, 16, 2, 64), page_codec.PageScales(1.0, 1.0))
    with pytest.raises(ValueError, match="9 \\* head_dim / 16"):
        page_codec.decode_heads(torch.zeros(3, 10, dtype=torch.uint8), 1.0)
