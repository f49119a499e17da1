"""Where a CPU stack's processes run (engine/supervisor/cpu_placement.py); the real stack is checked in
tests/api/test_lifecycle.py."""

from engine.supervisor.cpu_placement import host_cores


def test_host_processes_get_the_cores_no_engine_uses():
    assert host_cores({0}, 2) == {1}
    assert host_cores({0, 2}, 4) == {1, 3}


def test_host_processes_share_every_core_when_engines_take_them_all():
    assert host_cores({0, 1}, 2) == {0, 1}
    assert host_cores({0}, 1) == {0}


def test_disaggregated_host_processes_leave_the_decode_cores_to_decode_engines():
    assert host_cores({0, 1}, 2, decode_cores={1}) == {0}
    assert host_cores({0, 1, 2, 3}, 4, decode_cores={2, 3}) == {0, 1}
    assert host_cores({0}, 2, decode_cores={0}) == {1}        # a free core still comes first
    assert host_cores({0, 1}, 2, decode_cores={0, 1}) == {0, 1}  # decode engines everywhere: share
