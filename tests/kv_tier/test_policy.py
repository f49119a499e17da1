"""The policy-version file: the hook a live weight update writes and each worker's connector reads."""

import os

from engine.kv_tier.policy import VersionFile, write_policy_version


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
