"""benchmarks/fleet_plan.py: invariants of the GB200 NVL72 arithmetic, not its numbers."""

import dataclasses

from benchmarks.fleet_plan import Assumptions, distinct_kv_tokens_per_group, kv_tokens_per_gpu, plan, rack_layout

A = Assumptions()


def test_nvfp4_holds_576_over_352_the_tokens_of_fp8():
    p = plan(A)
    ratio = p["kv_tokens_per_decode_gpu_nvfp4"] / p["kv_tokens_per_decode_gpu_fp8"]
    assert abs(ratio - 576 / 352) < 1e-5
    assert abs(p["grace_tier_tokens_per_rack_nvfp4"] / p["grace_tier_tokens_per_rack_fp8"] - 576 / 352) < 1e-6


def test_warm_sessions_grow_with_the_tier():
    counts = [plan(dataclasses.replace(A, grace_kv_fraction=f)) for f in (0.0, 0.25, 0.5, 0.75)]
    for fmt in ("fp8", "nvfp4"):
        with_tier = [p[f"sessions_warm_per_rack_{fmt}_with_grace_tier"] for p in counts]
        assert with_tier == sorted(with_tier) and with_tier[-1] > with_tier[0]
        assert with_tier[0] == counts[0][f"sessions_warm_per_rack_{fmt}"]  # no tier: HBM alone
        assert all(p[f"sessions_warm_per_rack_{fmt}_with_grace_tier"] >= p[f"sessions_warm_per_rack_{fmt}"]
                   for p in counts)


def test_mla_kv_is_replicated_by_tp_and_split_by_dep():
    assert distinct_kv_tokens_per_group(A, "TP", 4, "fp8") == kv_tokens_per_gpu(A, "TP", 4, "fp8")
    assert distinct_kv_tokens_per_group(A, "DEP", 8, "fp8") == 8 * kv_tokens_per_gpu(A, "DEP", 8, "fp8")


def test_the_rack_is_filled_by_whole_units():
    layout = rack_layout(A)
    used = (layout["prefill_groups_per_rack"] * layout["gpus_per_prefill_group"]
            + layout["decode_groups_per_rack"] * layout["gpus_per_decode_group"])
    assert used + layout["gpus_left_over_per_rack"] == A.gpus_per_rack
    assert layout["decode_groups_per_rack"] == 4 * layout["prefill_groups_per_rack"]


def test_the_json_keys_exist():
    p = plan(A)
    for key in ("sessions_warm_per_rack_fp8", "sessions_warm_per_rack_nvfp4",
                "sessions_warm_per_rack_fp8_with_grace_tier", "sessions_warm_per_rack_nvfp4_with_grace_tier",
                "prefill_groups_per_rack", "decode_groups_per_rack", "gpus_per_prefill_group",
                "gpus_per_decode_group", "kv_tokens_per_decode_gpu_fp8", "kv_tokens_per_decode_gpu_nvfp4",
                "prime_cached_tokens_per_decoder_fp8", "computed_cached_tokens_per_decoder_fp8",
                "computed_over_prime_cached_tokens_per_decoder_fp8_ratio"):
        assert key in p, key
    assert all(isinstance(v, (int, float, str)) for v in p.values())  # one flat object
