"""Worker roles and the flags of disaggregated serving, checked against Dynamo's own argument parsers (no stack)."""

import argparse
import json

import pytest
from pydantic import ValidationError

from engine.supervisor import disaggregation
from engine.supervisor.stack import Stack, worker_layout
from rollout_server.settings import Settings


def test_prefill_and_decode_workers_replace_aggregated_ones():
    settings = Settings(workers=3, prefill_workers=1, decode_workers=2, nixl_side_channel_base_port=25000).engine
    layout = worker_layout(settings)
    assert [w.role for w in layout] == ["prefill", "decode", "decode"]
    assert [w.nixl_port for w in layout] == [25000, 25001, 25002]
    assert len({w.system_port for w in layout}) == len({w.kv_events_port for w in layout}) == 3
    assert [w.role for w in worker_layout(Settings(workers=2).engine)] == ["aggregated", "aggregated"]
    assert worker_layout(Settings(workers=2).engine)[0].nixl_port is None


@pytest.mark.parametrize("roles, cores, expected", [
    (["prefill", "decode", "decode"], 2, [0, 1, 1]),  # the disagg tests' stack: decode workers share core 1
    (["prefill", "decode"], 2, [0, 1]),
    (["prefill", "prefill", "decode", "decode"], 3, [0, 0, 1, 2]),
    (["prefill", "decode", "decode"], 4, [0, 1, 2]),  # enough cores: one each
    (["aggregated"] * 3, 2, [0, 1, 0]),  # aggregated workers round-robin
    (["prefill", "decode"], 1, [0, 0]),
])
def test_prefill_and_decode_workers_get_cores_of_their_own(roles, cores, expected):
    assert disaggregation.worker_cores(roles, cores) == expected


@pytest.mark.parametrize("given", [{"prefill_workers": 1}, {"decode_workers": 2},
                                   {"prefill_workers": 1, "decode_workers": 1, "router_mode": "round-robin"}])
def test_incomplete_or_unroutable_disaggregation_is_refused(given):
    with pytest.raises(ValidationError):
        Settings(**given)


def _dynamo_frontend_config(argv: list[str]):
    from dynamo.frontend.frontend_args import FrontendArgGroup, FrontendConfig

    parser = argparse.ArgumentParser()
    FrontendArgGroup().add_arguments(parser)
    config = FrontendConfig.from_cli_args(parser.parse_args(argv))
    config.validate()
    return config


def test_thresholds_reach_dynamos_conditional_disaggregation():
    settings = Settings(prefill_workers=1, decode_workers=1, disagg_local_max_uncached_tokens=700,
                        disagg_local_min_cached_fraction=0.8).engine.disaggregation
    config = _dynamo_frontend_config(["--router-mode", "kv"] + disaggregation.frontend_args(settings))
    assert config.conditional_disagg_enabled
    assert config.conditional_disagg_policy == "isl_bounding"
    assert config.conditional_disagg_eff_isl_threshold == 700
    assert config.conditional_disagg_eff_isl_ratio_threshold == pytest.approx(0.2)


def test_a_busy_prefill_threshold_selects_dynamos_load_aware_policy():
    settings = Settings(prefill_workers=1, decode_workers=1,
                        disagg_local_when_prefill_busy=1.5).engine.disaggregation
    config = _dynamo_frontend_config(["--router-mode", "kv"] + disaggregation.frontend_args(settings))
    assert config.conditional_disagg_policy == "isl_or_load"
    assert config.conditional_disagg_prefill_busy_threshold == 1.5
    assert config.conditional_disagg_eff_isl_threshold == settings.disagg_local_max_uncached_tokens


def test_zero_threshold_means_always_prefill_remotely():
    settings = Settings(prefill_workers=1, decode_workers=1, disagg_local_max_uncached_tokens=0).engine.disaggregation
    assert disaggregation.frontend_args(settings) == []
    assert not _dynamo_frontend_config(["--router-mode", "kv"]).conditional_disagg_enabled


def test_worker_specs_carry_role_nixl_and_prefill_budget(tmp_path):
    settings = Settings(prefill_workers=1, decode_workers=1, prefill_budget_tokens=1024).engine
    stack = Stack(settings, tmp_path / "model", "tiny", state_dir=tmp_path / "state", cache_dir=tmp_path)
    env = {"DYN_DISCOVERY_BACKEND": "file"}
    prefill, decode = (stack._worker_spec(w, env) for w in stack.workers)

    assert prefill.argv[2] == decode.argv[2] == "engine.worker.dynamo_worker"
    for spec, role in ((prefill, "prefill"), (decode, "decode")):
        argv = spec.argv
        assert argv[argv.index("--disaggregation-mode") + 1] == role
        transfer = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert transfer["kv_connector"] == "NixlConnector"
        assert transfer["kv_connector_extra_config"]["kv_lease_duration"] == settings.disaggregation.disagg_kv_lease_s
        assert spec.env["UCX_NET_DEVICES"] == "lo" and spec.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
        # Both ends of a transfer allocate their KV cache block-major (engine/worker/block_major_kv.py).
        assert spec.env["VLLM_KV_CACHE_LAYOUT"] == spec.env["ROLLOUT_SERVE_KV_LAYOUT"] == "BLHNC"
    assert prefill.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] != decode.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]
    # argparse keeps the last value of a repeated flag: the prefill worker chunks at its budget.
    assert prefill.argv[len(prefill.argv) - prefill.argv[::-1].index("--max-num-batched-tokens")] == "1024"
    assert "--enable-chunked-prefill" in prefill.argv and "--no-enable-chunked-prefill" not in prefill.argv
