"""engine/supervisor/compute_dtype.py: float32 checkpoints stay float32 on CPUs that would emulate bfloat16."""

import json

import pytest

from engine.supervisor import compute_dtype
from engine.supervisor.compute_dtype import checkpoint_dtype, cpu_has_native_bf16, kv_cache_dtype, worker_dtype

AVX2_ONLY = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\n"
SAPPHIRE_RAPIDS = "flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
COOPER_LAKE = "flags\t\t: avx2 avx512f avx512_bf16\n"
NEOVERSE_V1 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"
NEOVERSE_N1 = "processor\t: 0\nFeatures\t: fp asimd crc32 atomics\n"


@pytest.mark.parametrize("cpuinfo, native", [
    (AVX2_ONLY, False), (SAPPHIRE_RAPIDS, True), (COOPER_LAKE, True), (NEOVERSE_V1, True), (NEOVERSE_N1, False),
    ("processor\t: 0\n", True),  # no flags to read: leave the choice to vLLM
])
def test_reads_bf16_support_from_cpu_flags(cpuinfo, native):
    assert cpu_has_native_bf16(cpuinfo) is native


def _checkpoint(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("config, dtype", [
    ({"dtype": "float32"}, "float32"), ({"torch_dtype": "bfloat16"}, "bfloat16"), ({"torch_dtype": "float"}, "float32"),
    ({}, "bfloat16"),
])
def test_checkpoint_dtype_is_what_config_json_declares(tmp_path, config, dtype):
    assert checkpoint_dtype(_checkpoint(tmp_path, **config)) == dtype


@pytest.mark.parametrize("setting, checkpoint, on_cpu, native_bf16, expected", [
    ("auto", "float32", True, False, "float32"),     # the case this module exists for
    ("auto", "float32", True, True, "auto"),         # a CPU with bfloat16 arithmetic: vLLM's choice
    ("auto", "bfloat16", True, False, "auto"),       # a bfloat16 checkpoint is not widened
    ("auto", "float32", False, False, "auto"),       # GPUs: vLLM's choice
    ("bfloat16", "float32", True, False, "bfloat16"),  # an explicit setting always wins
])
def test_worker_dtype(tmp_path, monkeypatch, setting, checkpoint, on_cpu, native_bf16, expected):
    monkeypatch.setattr(compute_dtype, "cpu_has_native_bf16", lambda: native_bf16)
    assert worker_dtype(setting, _checkpoint(tmp_path, dtype=checkpoint), on_cpu) == expected


def test_a_missing_checkpoint_leaves_the_choice_to_vllm(tmp_path, monkeypatch):
    monkeypatch.setattr(compute_dtype, "cpu_has_native_bf16", lambda: False)
    assert worker_dtype("auto", tmp_path / "not-built-yet", on_cpu=True) == "auto"


def test_kv_cache_dtype_follows_the_engine_dtype(tmp_path):
    float32_checkpoint = _checkpoint(tmp_path, dtype="float32")
    assert kv_cache_dtype("float32", float32_checkpoint) == "float32"
    assert kv_cache_dtype("auto", float32_checkpoint) == "bfloat16"  # vLLM's auto
    assert kv_cache_dtype("auto", _checkpoint(tmp_path, dtype="float16")) == "float16"
