"""The policy-version file: the hook a live weight update writes and each worker's connector reads."""

import os

from engine.kv_tier.policy import VersionFile, Weights, write_adapter_version, write_policy_version


def test_default_until_the_file_exists_then_its_value(tmp_path):
    path = tmp_path / "kv-tier" / "policy-version.worker-0"
    version = VersionFile(path, default=2)
    assert version.current() == 2
    write_policy_version(path, 5)
    assert version.current() == 5


def test_rereads_after_every_write_and_leaves_no_temporary_files(tmp_path):
    path = tmp_path / "v"
    version = VersionFile(path, default=0)
    for value in (1, 2, 1, 7):
        write_policy_version(path, value)
        assert version.current() == value
    assert os.listdir(tmp_path) == ["v"]


def test_no_file_configured_means_the_default(tmp_path):
    assert VersionFile(None, default=9).current() == 9


def test_adapter_versions_sit_beside_the_full_weights_version(tmp_path):
    path = tmp_path / "v"
    version = VersionFile(path, default=0)
    write_adapter_version(path, "coder", 4)
    write_policy_version(path, 2)  # a full-weights update keeps the adapters' lines
    write_adapter_version(path, "sql agent", 7)
    assert (version.weights_of("coder"), version.weights_of("sql agent")) == (Weights(2, 4), Weights(2, 7))
    assert version.weights_of("") == Weights(2) and version.weights_of("other") == Weights(2)
    write_adapter_version(path, "coder", None)
    assert version.weights_of("coder") == Weights(2) and version.current() == 2
