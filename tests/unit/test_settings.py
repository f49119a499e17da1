"""The settings tree (rollout_server/settings.py): one typed tree, a section per package; every field set by its
short name or its full path, on the command line, in the environment or as a keyword; `--help` by section."""

import argparse
import os

import pytest

from rollout_server.cli.settings_flags import add_settings_arguments, settings_from_args
from rollout_server.settings import ENV_PREFIX, SETTINGS_NAMES, Settings


@pytest.fixture(autouse=True)
def no_settings_in_the_environment(monkeypatch):
    for name in [n for n in os.environ if n.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)


def parse(*argv: str) -> Settings:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    return settings_from_args(parser.parse_args(list(argv)))


def test_each_package_reads_its_own_section():
    settings = Settings()
    assert type(settings.engine).__module__ == "engine.settings"
    assert type(settings.engine.kv_tier).__module__ == "engine.kv_tier.settings"
    assert type(settings.traces).__module__ == "trace_pipeline.settings"
    assert type(settings.deploy).__module__ == "finetune_deploy.settings"
    assert type(settings.server).__module__ == "rollout_server.settings"


def test_the_flags_and_environment_names_of_before_the_tree_still_work(monkeypatch):
    monkeypatch.setenv("ROLLOUT_SERVE_WORKERS", "3")
    monkeypatch.setenv("ROLLOUT_SERVE_CACHE_DIR", "/tmp/rs-cache")
    monkeypatch.setenv("ROLLOUT_SERVE_KV_TIER__ENABLED", "true")
    monkeypatch.setenv("ROLLOUT_SERVE_TRACES__ENABLED", "false")
    settings = parse("--port", "9000", "--frontend-port", "9100", "--no-embedded-router", "--enable-lora",
                     "--prefill-workers", "1", "--decode-workers", "1", "--database-url", "sqlite:///x.db")
    assert settings.engine.workers == 3 and str(settings.state.cache_dir) == "/tmp/rs-cache"
    assert settings.engine.kv_tier.enabled and not settings.traces.enabled
    assert settings.server.port == 9000 and settings.engine.frontend_port == 9100
    assert not settings.engine.embedded_router and settings.engine.lora.enable_lora
    assert settings.engine.disaggregation.enabled and settings.state.database_url == "sqlite:///x.db"


def test_fields_of_sections_with_repeated_names_go_by_section():
    settings = parse("--kv-tier-enabled", "--traces-flush-every-s", "2.5", "--batches-max-in-flight", "8")
    assert settings.engine.kv_tier.enabled and settings.traces.flush_every_s == 2.5
    assert settings.batches.max_in_flight == 8
    assert Settings(kv_tier_capacity_gib=0.5, usage_enabled=False).engine.kv_tier.capacity_gib == 0.5


def test_the_full_path_wins_over_the_short_name_and_a_flag_over_both(monkeypatch):
    monkeypatch.setenv("ROLLOUT_SERVE_WORKERS", "2")
    assert Settings().engine.workers == 2
    monkeypatch.setenv("ROLLOUT_SERVE_ENGINE__WORKERS", "4")
    assert Settings().engine.workers == 4
    assert parse("--workers", "5").engine.workers == 5


def test_every_field_has_one_flag_and_help_is_grouped_by_section():
    flags = [s.flag for s in SETTINGS_NAMES]
    assert len(flags) == len(set(flags))
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    text = parser.format_help()
    for section in ("server settings", "state settings", "engine settings", "engine.disaggregation settings",
                    "engine.kv_tier settings", "traces settings", "deploy settings"):
        assert section in text
    assert all(flag in text for flag in flags)


def test_a_bad_value_names_the_field():
    with pytest.raises(ValueError, match="prefill_workers and decode_workers go together"):
        Settings(prefill_workers=1)
    with pytest.raises(ValueError, match="workers"):
        Settings(workers=0)
