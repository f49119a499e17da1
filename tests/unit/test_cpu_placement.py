"""Where a CPU stack's processes run (engine/cpu_placement.py); the real stack is checked in
tests/api/test_lifecycle.py."""

from engine.cpu_placement import host_cores


def test_host_processes_get_the_cores_no_engine_uses():
    assert host_cores({0}, 2) == {1}
    assert host_cores({0, 2}, 4) == {1, 3}


def test_host_processes_share_every_core_when_engines_take_them_all():
    assert host_cores({0, 1}, 2) == {0, 1}
    assert host_cores({0}, 1) == {0}
