"""The tier's settings: nested in rollout-serve's Settings, off by default, settable through the environment."""

import os

from engine.kv_tier.settings import KvTierSettings
from rollout_server.settings import Settings


def test_off_by_default_with_nvfp4_blocks(monkeypatch):
    for name in [n for n in os.environ if n.startswith("ROLLOUT_SERVE_KV_TIER__")]:
        monkeypatch.delenv(name)
    tier = Settings().engine.kv_tier
    assert tier.enabled is False and tier.nvfp4 is True


def test_as_env_is_what_a_child_rollout_serve_reads_back(monkeypatch):
    wanted = KvTierSettings(enabled=True, capacity_gib=0.5, nvfp4=False, port_base=41000)
    for name, value in wanted.as_env().items():
        monkeypatch.setenv(name, value)
    assert Settings().engine.kv_tier == wanted


def test_ports_are_distinct_and_derived_from_the_base():
    tier = KvTierSettings(port_base=41000)
    assert (tier.master_port, tier.metrics_port, tier.holder_port) == (41000, 41001, 41002)
    assert tier.master_address == "127.0.0.1:41000"
    assert tier.capacity_bytes == int(tier.capacity_gib * 2**30)
