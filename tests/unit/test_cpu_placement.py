"""Where a CPU stack's processes run (engine/cpu_placement.py); the real stack is checked in
tests/api/test_lifecycle.py."""

import pytest

from engine.cpu_placement import host_cores, pinned_cores


@pytest.mark.parametrize("bind, cores", [("1", {1}), ("0-3", {0, 1, 2, 3}), ("0,2", {0, 2}), ("0-1,4", {0, 1, 4})])
def test_a_worker_bind_list_names_its_cores(bind, cores):
    assert pinned_cores(bind) == cores


def test_host_processes_get_the_cores_no_engine_uses():
    assert host_cores({0}, 2) == {1}
    assert host_cores({0, 2}, 4) == {1, 3}


def test_host_processes_share_every_core_when_engines_take_them_all():
    assert host_cores({0, 1}, 2) == {0, 1}
    assert host_cores({0}, 1) == {0}
