"""A GB200 NVL72 rack plan for a GLM-5-class MLA MoE model, computed (issue 44, part 5).

Nothing here is measured. Every figure this script prints is arithmetic on the constants of `Assumptions`
below, each named with its source, and every output figure is labelled "computed" where it is one. Where
the arithmetic disagrees with a figure Prime Intellect reported for its own GLM-5 deployment, the script
prints both, their ratio, and the reason it sees.

The rule of the plan:

1. A rack is cut into units of Prime's operating point: 1 prefill group (DEP8: attention data-parallel,
   experts split over 8 GPUs) for every 4 decode groups (TP4). 72 GPUs / (8 + 4 x 4) = 3 units.
2. A GPU's KV budget is its HBM that vLLM may use (gpu_memory_utilization) less its share of the weights
   and an activation workspace. The KV of one token is one MLA row per layer: 576 bytes in FP8 (512
   latent + 64 RoPE), 352 in NVFP4 (kernels/mla_codec.py).
3. MLA has one KV "head", so tensor parallelism cannot split it: a TP4 decode group (and a TEP8 group)
   holds the same rows on every rank. A decode group therefore holds one GPU's worth of distinct tokens.
   DEP8 ranks each hold their own requests, so a DEP8 prefill group holds 8 GPUs' worth, less the room
   its replicated non-expert weights take.
4. The Grace tier: a stated fraction of the rack's 36 x 480 GB LPDDR5X holds KV rows in the same format
   as HBM (FP8 rows lossless for the FP8 plan, NVFP4 rows for the NVFP4 plan).
5. A session is warm where its whole context (140k tokens) is held. A session lives on one decode group
   or one DEP rank, so sessions are counted per group (floor), then summed. The tier is inclusive (the
   connector saves every finished turn, docs/kv_tier.md "When blocks move"), so with the tier the rack
   keeps the tier's sessions plus the ones decoding right now, never fewer than HBM alone.

Run:  .venv/bin/python benchmarks/fleet_plan.py [--hbm-gb 186] [--grace-kv-fraction 0.5] [--session-tokens 140000]
Prints a table and writes one flat JSON object to benchmarks/results/fleet_plan.json. Runs in well under a second.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "fleet_plan.json"
GB = 10**9  # decimal gigabytes, as NVIDIA states HBM and LPDDR5X sizes


@dataclass(frozen=True)
class Assumptions:
    """Every input of the plan, with where it comes from. Change one with a flag, never in the code below."""

    # ---- the model: GLM-5 (744B total, 40B active), MLA + DeepSeek Sparse Attention
    # GLM-5 technical report table (tabulated at https://glennklockwood.com/garden/GLM-5): 3 dense + 75 MoE
    # layers, hidden 6144, MoE intermediate 2048, 256 routed experts; "78 transformer layers"
    # (https://docs.nvidia.com/nemo/megatron-bridge/nightly/models/glm/glm5.html).
    layers: int = 78
    moe_layers: int = 75
    total_params: float = 744e9
    routed_experts: int = 256
    hidden_size: int = 6144
    moe_intermediate_size: int = 2048
    # MLA row per token per layer: kernels/mla_codec.py (FP8_ROW_BYTES, ROW_BYTES);
    # /work/shared/notes/field-notes.md line 109-110.
    mla_row_bytes_fp8: int = 576
    mla_row_bytes_nvfp4: int = 352
    # DSA indexer key per token per layer: 128 FP8 values + one FP32 scale per 128 = 132 bytes (vLLM's
    # DeepseekV32IndexerBackend and SGLang's NSATokenToKVPool: index_head_dim + index_head_dim // 128 * 4).
    # Not in the plan's rows (the brief's rule is the MLA row); used only to explain Prime's ratio.
    dsa_indexer_bytes: int = 132

    # ---- weights in HBM (assumption: NVIDIA's NVFP4 checkpoints quantize the MoE experts; we assume the
    # rest, attention, dense layers, shared experts and embeddings, stays BF16, the heavier case).
    expert_bytes_per_param: float = 4.5 / 8  # NVFP4: 4-bit E2M1 + one E4M3 scale per 16 values
    non_expert_bytes_per_param: float = 2.0  # BF16

    # ---- the GPU and the rack: https://www.nvidia.com/en-us/data-center/gb200-nvl72/ (13.4 TB HBM3e over
    # 72 GPUs = 186 GB each; 17 TB LPDDR5X over 36 Grace CPUs, 480 GB each)
    hbm_gb_per_gpu: float = 186.0
    gpus_per_rack: int = 72
    grace_cpus_per_rack: int = 36
    grace_lpddr_gb: float = 480.0
    # vLLM's default gpu_memory_utilization (https://docs.vllm.ai/en/latest/configuration/engine_args.html)
    gpu_memory_utilization: float = 0.90
    # activations, CUDA graphs, MoE all-to-all buffers inside vLLM's share; assumption, not measured
    # (vLLM profiles it at start-up)
    activation_workspace_gb: float = 8.0
    # share of each Grace's LPDDR5X given to the KV tier; assumption: the other half runs the OS, the
    # vLLM and Dynamo processes, pinned staging buffers and RL weight staging for refits
    grace_kv_fraction: float = 0.5

    # ---- Prime Intellect's operating point (issue 44 brief; Prime's GLM-5 deployment on GB200)
    prefill_groups_per_unit: int = 1
    decode_groups_per_unit: int = 4
    gpus_per_prefill_group: int = 8  # DEP8
    gpus_per_decode_group: int = 4  # TP4
    prime_sessions_per_prefill_group: int = 66
    prime_tokens_per_s_per_user: float = 101.0
    prime_output_tokens_per_s_per_gpu: float = 100.0
    prime_dep8_over_tep8_prefix_capacity: float = 5.0  # "about 5x"
    # field-notes.md line 110: "measured in production as 1.09M -> 1.63M cached tokens per decoder"
    prime_cached_tokens_per_decoder_fp8: float = 1.09e6
    prime_cached_tokens_per_decoder_nvfp4: float = 1.63e6

    # ---- the workload: a long agent session (issue 44 brief)
    session_tokens: int = 140_000


# ---------------------------------------------------------------- bytes per token

def row_bytes(a: Assumptions, kv_format: str) -> int:
    """One token's MLA row in one layer, in bytes."""
    return {"fp8": a.mla_row_bytes_fp8, "nvfp4": a.mla_row_bytes_nvfp4}[kv_format]


def kv_bytes_per_token(a: Assumptions, kv_format: str) -> int:
    """One token's KV over every layer: one MLA row per layer."""
    return a.layers * row_bytes(a, kv_format)


# ---------------------------------------------------------------- weights and the KV budget of one GPU

def routed_expert_params(a: Assumptions) -> float:
    """Routed experts: gate, up and down projections (3 matrices of hidden x MoE intermediate) per expert."""
    return a.moe_layers * a.routed_experts * 3 * a.hidden_size * a.moe_intermediate_size


def non_expert_params(a: Assumptions) -> float:
    """Everything else (attention, dense layers, shared experts, embeddings): the total less the routed experts."""
    return a.total_params - routed_expert_params(a)


def weight_gb_per_gpu(a: Assumptions, parallelism: str, ranks: int) -> float:
    """Weights one GPU holds. TP and TEP split every weight over the ranks; DEP splits the experts
    (expert parallel) but gives every rank its own copy of attention and the dense parts."""
    experts = routed_expert_params(a) * a.expert_bytes_per_param / ranks
    rest = non_expert_params(a) * a.non_expert_bytes_per_param
    if parallelism in ("TP", "TEP"):
        rest /= ranks
    elif parallelism != "DEP":
        raise ValueError(f"unknown parallelism {parallelism!r}; expected TP, TEP or DEP")
    return (experts + rest) / GB


def kv_budget_gb_per_gpu(a: Assumptions, parallelism: str, ranks: int) -> float:
    """HBM left for KV on one GPU: vLLM's share of HBM, less weights and the activation workspace."""
    usable = a.hbm_gb_per_gpu * a.gpu_memory_utilization
    return usable - weight_gb_per_gpu(a, parallelism, ranks) - a.activation_workspace_gb


def kv_tokens_per_gpu(a: Assumptions, parallelism: str, ranks: int, kv_format: str) -> int:
    return math.floor(kv_budget_gb_per_gpu(a, parallelism, ranks) * GB / kv_bytes_per_token(a, kv_format))


def distinct_kv_tokens_per_group(a: Assumptions, parallelism: str, ranks: int, kv_format: str) -> int:
    """Tokens a group holds once each. MLA's single KV head is replicated by TP/TEP: one GPU's worth.
    DEP ranks hold different requests: ranks x one GPU's worth."""
    per_gpu = kv_tokens_per_gpu(a, parallelism, ranks, kv_format)
    return per_gpu * ranks if parallelism == "DEP" else per_gpu


# ---------------------------------------------------------------- the rack

def rack_layout(a: Assumptions) -> dict:
    gpus_per_unit = (a.prefill_groups_per_unit * a.gpus_per_prefill_group
                     + a.decode_groups_per_unit * a.gpus_per_decode_group)
    units = a.gpus_per_rack // gpus_per_unit
    return {
        "gpus_per_unit": gpus_per_unit,
        "units_per_rack": units,
        "prefill_groups_per_rack": units * a.prefill_groups_per_unit,
        "decode_groups_per_rack": units * a.decode_groups_per_unit,
        "gpus_per_prefill_group": a.gpus_per_prefill_group,
        "gpus_per_decode_group": a.gpus_per_decode_group,
        "gpus_left_over_per_rack": a.gpus_per_rack - units * gpus_per_unit,
    }


def grace_tier_gb_per_rack(a: Assumptions) -> float:
    return a.grace_cpus_per_rack * a.grace_lpddr_gb * a.grace_kv_fraction


def sessions_per_pool(tokens: int, session_tokens: int) -> int:
    """Whole sessions one pool (a decode group, a DEP rank) holds: a session's KV does not split across pools."""
    return tokens // session_tokens


def warm_sessions(a: Assumptions, kv_format: str) -> dict:
    """Sessions a rack keeps warm, in HBM (decode groups + prefill DEP ranks) and with the Grace tier."""
    layout = rack_layout(a)
    decode_tokens = distinct_kv_tokens_per_group(a, "TP", a.gpus_per_decode_group, kv_format)
    prefill_rank_tokens = kv_tokens_per_gpu(a, "DEP", a.gpus_per_prefill_group, kv_format)
    in_decode = layout["decode_groups_per_rack"] * sessions_per_pool(decode_tokens, a.session_tokens)
    in_prefill = (layout["prefill_groups_per_rack"] * a.gpus_per_prefill_group
                  * sessions_per_pool(prefill_rank_tokens, a.session_tokens))
    in_hbm = in_decode + in_prefill
    tier_tokens = math.floor(grace_tier_gb_per_rack(a) * GB / kv_bytes_per_token(a, kv_format))
    in_tier = sessions_per_pool(tier_tokens, a.session_tokens)
    # Inclusive tier: HBM's sessions are in the tier too, except those decoding now (not yet saved).
    decoding_now = min(layout["prefill_groups_per_rack"] * a.prime_sessions_per_prefill_group, in_hbm)
    with_tier = max(in_hbm, in_tier + decoding_now)
    return {
        f"kv_tokens_per_decode_gpu_{kv_format}": decode_tokens,
        f"kv_tokens_per_prefill_dep_rank_{kv_format}": prefill_rank_tokens,
        f"grace_tier_tokens_per_rack_{kv_format}": tier_tokens,
        f"sessions_warm_in_decode_hbm_{kv_format}": in_decode,
        f"sessions_warm_in_prefill_hbm_{kv_format}": in_prefill,
        f"sessions_warm_per_rack_{kv_format}": in_hbm,
        f"sessions_in_grace_tier_{kv_format}": in_tier,
        f"sessions_warm_per_rack_{kv_format}_with_grace_tier": with_tier,
        f"sessions_warm_per_rack_{kv_format}_with_grace_tier_if_exclusive": in_hbm + in_tier,
    }


# ---------------------------------------------------------------- against Prime's reported figures

def prime_comparison(a: Assumptions) -> dict:
    """Where this arithmetic and Prime's reported figures disagree, by how much (ratio = computed / reported)."""
    out = {}
    # 1. Cached tokens per decoder (a TP4 decode group = one GPU's distinct tokens).
    for fmt in ("fp8", "nvfp4"):
        reported = getattr(a, f"prime_cached_tokens_per_decoder_{fmt}")
        computed = distinct_kv_tokens_per_group(a, "TP", a.gpus_per_decode_group, fmt)
        out[f"prime_cached_tokens_per_decoder_{fmt}"] = reported
        out[f"computed_cached_tokens_per_decoder_{fmt}"] = computed
        out[f"computed_over_prime_cached_tokens_per_decoder_{fmt}_ratio"] = computed / reported
        # the HBM Prime's count implies at our layer count, with MLA rows alone and with the DSA indexer key
        out[f"prime_implied_kv_gb_per_decoder_{fmt}"] = reported * kv_bytes_per_token(a, fmt) / GB
        out[f"prime_implied_kv_gb_per_decoder_{fmt}_with_dsa_indexer"] = (
            reported * a.layers * (row_bytes(a, fmt) + a.dsa_indexer_bytes) / GB)
        # the layer count Prime's count implies at our computed budget
        out[f"prime_implied_layers_at_computed_budget_{fmt}"] = (
            kv_budget_gb_per_gpu(a, "TP", a.gpus_per_decode_group) * GB / (reported * row_bytes(a, fmt)))
    # 2. NVFP4 over FP8: the row sizes give 576/352; Prime saw less.
    out["computed_nvfp4_over_fp8_tokens"] = a.mla_row_bytes_fp8 / a.mla_row_bytes_nvfp4
    out["prime_nvfp4_over_fp8_tokens"] = a.prime_cached_tokens_per_decoder_nvfp4 / a.prime_cached_tokens_per_decoder_fp8
    out["computed_nvfp4_over_fp8_tokens_with_dsa_indexer"] = (
        (a.mla_row_bytes_fp8 + a.dsa_indexer_bytes) / (a.mla_row_bytes_nvfp4 + a.dsa_indexer_bytes))
    # 3. DEP8 over TEP8 prefix-cache capacity.
    dep = distinct_kv_tokens_per_group(a, "DEP", a.gpus_per_prefill_group, "fp8")
    tep = distinct_kv_tokens_per_group(a, "TEP", a.gpus_per_prefill_group, "fp8")
    out["computed_dep8_over_tep8_prefix_capacity"] = dep / tep
    out["prime_dep8_over_tep8_prefix_capacity"] = a.prime_dep8_over_tep8_prefix_capacity
    out["computed_over_prime_dep8_over_tep8_ratio"] = dep / tep / a.prime_dep8_over_tep8_prefix_capacity
    # 4. Throughput: 66 sessions x 101 tok/s per unit of 24 GPUs vs 100 tok/s/GPU.
    layout = rack_layout(a)
    per_gpu = a.prime_sessions_per_prefill_group * a.prime_tokens_per_s_per_user / layout["gpus_per_unit"]
    out["computed_output_tokens_per_s_per_gpu_if_all_sessions_decode"] = per_gpu
    out["prime_output_tokens_per_s_per_gpu"] = a.prime_output_tokens_per_s_per_gpu
    out["computed_over_prime_output_tokens_per_s_per_gpu_ratio"] = per_gpu / a.prime_output_tokens_per_s_per_gpu
    out["computed_decode_duty_cycle_implied_by_prime"] = a.prime_output_tokens_per_s_per_gpu / per_gpu
    # 5. 66 sessions per prefill group = 16.5 per decode group: what mean context fits their decoders.
    per_decode_group = a.prime_sessions_per_prefill_group / a.decode_groups_per_unit
    out["prime_sessions_per_decode_group"] = per_decode_group
    for fmt in ("fp8", "nvfp4"):
        out[f"computed_mean_context_tokens_prime_decoders_fit_{fmt}"] = (
            getattr(a, f"prime_cached_tokens_per_decoder_{fmt}") / per_decode_group)
    return out


# ---------------------------------------------------------------- the plan

def plan(a: Assumptions) -> dict:
    """The whole plan as one flat dict (every value computed from `a`, except those named prime_*)."""
    out = {"note": "computed: arithmetic on stated constants, nothing measured (benchmarks/fleet_plan.py)"}
    out.update(rack_layout(a))
    for parallelism, ranks in (("TP", a.gpus_per_decode_group), ("DEP", a.gpus_per_prefill_group),
                               ("TEP", a.gpus_per_prefill_group)):
        key = f"{parallelism.lower()}{ranks}"
        out[f"weight_gb_per_gpu_{key}"] = weight_gb_per_gpu(a, parallelism, ranks)
        out[f"kv_budget_gb_per_gpu_{key}"] = kv_budget_gb_per_gpu(a, parallelism, ranks)
    out["kv_bytes_per_token_fp8"] = kv_bytes_per_token(a, "fp8")
    out["kv_bytes_per_token_nvfp4"] = kv_bytes_per_token(a, "nvfp4")
    out["grace_tier_gb_per_rack"] = grace_tier_gb_per_rack(a)
    out["concurrent_sessions_per_rack_at_prime_point"] = (
        out["prefill_groups_per_rack"] * a.prime_sessions_per_prefill_group)
    for fmt in ("fp8", "nvfp4"):
        out.update(warm_sessions(a, fmt))
    out.update(prime_comparison(a))
    out.update({f"assumption_{k}": v for k, v in dataclasses.asdict(a).items()})
    return out


def print_table(p: dict) -> None:
    def row(label, value, unit=""):
        if isinstance(value, float):
            value = f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
        elif isinstance(value, int):
            value = f"{value:,}"
        print(f"  {label:<58} {value:>14} {unit}")

    print("GB200 NVL72 plan for GLM-5 (all figures computed from stated constants; nothing measured)\n")
    print("Rack layout (Prime's 1 prefill : 4 decode, DEP8 prefill, TP4 decode)")
    row("GPUs per unit (1 x DEP8 + 4 x TP4)", p["gpus_per_unit"])
    row("units per rack", p["units_per_rack"])
    row("prefill groups / decode groups per rack",
        f"{p['prefill_groups_per_rack']} / {p['decode_groups_per_rack']}")
    row("GPUs left over", p["gpus_left_over_per_rack"])
    row("concurrent sessions per rack at Prime's point (66/prefill)", p["concurrent_sessions_per_rack_at_prime_point"])
    print(f"\nHBM per GPU ({p['assumption_hbm_gb_per_gpu']:g} GB x {p['assumption_gpu_memory_utilization']}, less "
          f"weights, less {p['assumption_activation_workspace_gb']:g} GB workspace)")
    for key, name in (("tp4", "TP4 decode"), ("dep8", "DEP8 prefill"), ("tep8", "TEP8 (comparison)")):
        row(f"{name}: weights / KV budget", f"{p[f'weight_gb_per_gpu_{key}']:.1f} / "
            f"{p[f'kv_budget_gb_per_gpu_{key}']:.1f}", "GB")
    title = f"KV capacity and warm {p['assumption_session_tokens'] / 1e3:g}k-token sessions"
    print(f"\n{title:<46} {'FP8':>12} {'NVFP4':>14}")
    for label, key in ((f"KV bytes per token ({p['assumption_layers']} layers)", "kv_bytes_per_token"),
                       ("tokens per decode GPU (= per TP4 group)", "kv_tokens_per_decode_gpu"),
                       ("tokens per DEP8 prefill rank", "kv_tokens_per_prefill_dep_rank"),
                       ("Grace tier tokens per rack", "grace_tier_tokens_per_rack"),
                       ("sessions in decode HBM", "sessions_warm_in_decode_hbm"),
                       ("sessions in prefill HBM", "sessions_warm_in_prefill_hbm"),
                       ("sessions warm per rack, HBM", "sessions_warm_per_rack"),
                       ("sessions in the Grace tier alone", "sessions_in_grace_tier")):
        print(f"  {label:<44} {p[f'{key}_fp8']:>12,} {p[f'{key}_nvfp4']:>14,}")
    print(f"  {'sessions warm per rack, HBM + Grace tier':<44} "
          f"{p['sessions_warm_per_rack_fp8_with_grace_tier']:>12,} "
          f"{p['sessions_warm_per_rack_nvfp4_with_grace_tier']:>14,}")
    print(f"  (Grace tier: {p['grace_tier_gb_per_rack']:,.0f} GB per rack = 36 x 480 GB x "
          f"{p['assumption_grace_kv_fraction']:g}; inclusive, so HBM sessions are counted once)")
    print("\nAgainst Prime's reported figures (computed / reported)")
    for fmt in ("fp8", "nvfp4"):
        row(f"cached tokens per decoder, {fmt}: computed vs Prime",
            f"{p[f'computed_cached_tokens_per_decoder_{fmt}']/1e6:.2f}M vs "
            f"{p[f'prime_cached_tokens_per_decoder_{fmt}']/1e6:.2f}M")
        row("  ratio", p[f"computed_over_prime_cached_tokens_per_decoder_{fmt}_ratio"])
        row(f"  HBM Prime's count implies ({p['assumption_layers']} layers): rows / +indexer",
            f"{p[f'prime_implied_kv_gb_per_decoder_{fmt}']:.1f} / "
            f"{p[f'prime_implied_kv_gb_per_decoder_{fmt}_with_dsa_indexer']:.1f}", "GB")
        row(f"  layers Prime's count implies at our {p['kv_budget_gb_per_gpu_tp4']:.1f} GB budget",
            p[f"prime_implied_layers_at_computed_budget_{fmt}"])
    row("NVFP4/FP8 tokens: rows 576/352 vs Prime",
        f"{p['computed_nvfp4_over_fp8_tokens']:.3f} vs {p['prime_nvfp4_over_fp8_tokens']:.3f}")
    row("  with the FP8 DSA indexer key (708/484)", p["computed_nvfp4_over_fp8_tokens_with_dsa_indexer"])
    row("DEP8 / TEP8 prefix capacity: computed vs Prime",
        f"{p['computed_dep8_over_tep8_prefix_capacity']:.2f} vs {p['prime_dep8_over_tep8_prefix_capacity']:.1f}")
    row("output tok/s/GPU if all 66 sessions decode vs Prime",
        f"{p['computed_output_tokens_per_s_per_gpu_if_all_sessions_decode']:.0f} vs "
        f"{p['prime_output_tokens_per_s_per_gpu']:.0f}")
    row("  decode duty cycle that reconciles them", p["computed_decode_duty_cycle_implied_by_prime"])
    row("mean context Prime's decoders fit at 16.5 sessions, FP8/NVFP4",
        f"{p['computed_mean_context_tokens_prime_decoders_fit_fp8']/1e3:.0f}k / "
        f"{p['computed_mean_context_tokens_prime_decoders_fit_nvfp4']/1e3:.0f}k", "tokens")


def main() -> None:
    defaults = Assumptions()
    parser = argparse.ArgumentParser(
        description=(
            "Compute a GB200 NVL72 rack plan for a GLM-5-class MLA MoE at Prime Intellect's operating point "
            "(1 DEP8 prefill : 4 TP4 decode): KV tokens per GPU in FP8 and NVFP4, the Grace-DRAM KV tier, warm "
            "140k-token sessions per rack, and each disagreement with Prime's reported figures. Pure arithmetic "
            "on the constants of Assumptions (every one with its source); nothing is measured."),
        epilog=f"Writes one flat JSON object to {RESULTS.relative_to(Path(__file__).parents[1])}.")
    parser.add_argument("--hbm-gb", type=float, default=defaults.hbm_gb_per_gpu,
                        help="HBM3e per GPU in decimal GB (default: %(default)s, NVIDIA's 13.4 TB / 72)")
    parser.add_argument("--grace-kv-fraction", type=float, default=defaults.grace_kv_fraction,
                        help="share of each Grace's 480 GB LPDDR5X given to the KV tier (default: %(default)s)")
    parser.add_argument("--session-tokens", type=int, default=defaults.session_tokens,
                        help="context of one agent session in tokens (default: %(default)s)")
    parser.add_argument("--layers", type=int, default=defaults.layers,
                        help="MLA layers holding KV (default: %(default)s, GLM-5; DeepSeek-V3 has 61)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON output path (default: %(default)s)")
    args = parser.parse_args()
    a = dataclasses.replace(defaults, hbm_gb_per_gpu=args.hbm_gb, grace_kv_fraction=args.grace_kv_fraction,
                            session_tokens=args.session_tokens, layers=args.layers)
    p = plan(a)
    print_table(p)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(p, indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
