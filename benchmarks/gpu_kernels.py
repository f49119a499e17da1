"""GPU check for the kernels package, one prepared run (a few minutes on an H100/H200):

  1. the GPU tests: pytest -m gpu tests/kernels (compiled kernels, BF16, timing assertion);
  2. timing of the fused NVFP4 decode kernel against dequantize-then-attend (staged) at 1, 15 and 35
     query tokens (one decode token per sequence), and of the sparse-MLA kernel at the same counts.

    .venv/bin/python benchmarks/gpu_kernels.py

Exits 2 with a message when CUDA is absent; otherwise with pytest's exit status.
"""

import functools
import math
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
QUERY_TOKENS = (1, 15, 35)
CONTEXT = 8192
Q_HEADS, KV_HEADS, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 64  # a Llama/Qwen-7B-class GQA layer
MLA_HEADS, MLA_SLOTS, MLA_TOP_K = 128, 65536, 2048  # DeepSeek-V3.2-style sparse MLA decode


def run_gpu_tests() -> int:
    print("== pytest -m gpu tests/kernels", flush=True)
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/kernels", "-q", "-s", "-p", "no:cacheprovider"]
    return subprocess.run(command, cwd=ROOT, check=False).returncode


def time_paged_decode() -> None:
    import triton.testing

    from kernels import attention_triton
    from kernels.synthetic import paged_decode_batch

    print(f"== paged decode, {Q_HEADS} q / {KV_HEADS} kv heads x {HEAD_DIM}, context {CONTEXT}, page {PAGE_SIZE}")
    print("   fused = the whole call: input checks (one read-back of seq_lens), kernel, merge of the splits")
    print(f"   {'tokens':>6s} {'fused ms':>9s} {'kernel ms':>10s} {'merge ms':>9s} {'staged ms':>10s} {'speed-up':>9s} "
          f"{'kernel KV GB/s':>15s}")
    for batch in QUERY_TOKENS:
        case = paged_decode_batch(batch, CONTEXT, q_heads=Q_HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, page_size=PAGE_SIZE)
        fused = triton.testing.do_bench(functools.partial(attention_triton.paged_decode_attention, *case))
        splits = functools.partial(attention_triton.paged_decode_splits, *case, None, None, math.ceil(CONTEXT / PAGE_SIZE))
        kernel = triton.testing.do_bench(splits)
        merge = triton.testing.do_bench(functools.partial(attention_triton.merge_splits, *splits()))
        staged = triton.testing.do_bench(functools.partial(attention_triton.staged_decode_attention, *case))
        kv_bytes = batch * CONTEXT * 2 * KV_HEADS * case.pages.shape[-1]  # NVFP4 K and V the kernel reads
        print(f"   {batch:6d} {fused:9.3f} {kernel:10.3f} {merge:9.3f} {staged:10.3f} {staged / fused:8.2f}x "
              f"{kv_bytes / kernel / 1e6:15.1f}", flush=True)
        del case
        torch.cuda.empty_cache()


def time_sparse_mla() -> None:
    import triton.testing

    from kernels import attention_triton, mla_codec

    print(f"== sparse MLA decode, {MLA_HEADS} heads, top-{MLA_TOP_K} of {MLA_SLOTS} slots (352-byte rows)")
    torch.manual_seed(0)
    latent = torch.randn(MLA_SLOTS, 512, device="cuda")
    rope = torch.randn(MLA_SLOTS, 64, device="cuda")
    scales = mla_codec.MlaScales.calibrate(latent, rope)
    rows = mla_codec.encode_rows(latent, rope, scales)
    for tokens in QUERY_TOKENS:
        q_latent = torch.randn(tokens, MLA_HEADS, 512, device="cuda", dtype=torch.bfloat16) * 0.3
        q_rope = torch.randn(tokens, MLA_HEADS, 64, device="cuda", dtype=torch.bfloat16)
        indices = torch.randint(0, MLA_SLOTS, (tokens, MLA_TOP_K), device="cuda", dtype=torch.int32)
        ms = triton.testing.do_bench(functools.partial(
            attention_triton.sparse_mla_attention, q_latent, q_rope, rows, indices, scales, 1 / math.sqrt(192)))
        print(f"   {tokens:6d} tokens {ms:9.3f} ms", flush=True)


def main() -> int:
    if not torch.cuda.is_available():
        print("benchmarks/gpu_kernels.py needs a CUDA GPU: torch.cuda.is_available() is False. "
              "Run it on the device machine.", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    tests_status = run_gpu_tests()
    time_paged_decode()
    time_sparse_mla()
    print(f"== GPU tests {'passed' if tests_status == 0 else f'FAILED (pytest exit {tests_status})'}")
    return tests_status


if __name__ == "__main__":
    sys.exit(main())
