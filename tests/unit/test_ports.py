"""A stack checks its fixed ports before it starts anything, and says which one is taken and by what role."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from engine.kv_tier.settings import KvTierSettings
from engine.settings import EngineSettings
from engine.supervisor.ports import ephemeral_range, is_free, ports_in_use
from engine.supervisor.stack import Stack, StackStartError
from rollout_server.harness.stack import REPO, free_port_block


@pytest.fixture
def listening_port():
    with socket.create_server(("127.0.0.1", free_port_block(1, start=29500))) as server:
        yield server.getsockname()[1]


def test_a_listening_port_is_not_free_and_is_free_again_once_closed():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert not is_free(port)
    assert is_free(port)


def test_ports_in_use_names_only_the_taken_ones(listening_port):
    other = free_port_block(1, start=listening_port + 1)
    assert ports_in_use({other: "spare", listening_port: "KV tier master"}) == [f"{listening_port} (KV tier master)"]


def test_test_ports_lie_below_the_ephemeral_range():
    assert free_port_block(3, start=32000) + 3 <= ephemeral_range().start
    with pytest.raises(RuntimeError, match="below the ephemeral range"):
        free_port_block(3, start=ephemeral_range().start)


def test_a_stack_whose_tier_port_is_taken_starts_nothing_and_names_the_port(listening_port, tmp_path):
    base = free_port_block(8, start=28000)
    settings = EngineSettings(frontend_port=base, worker_system_base_port=base + 1, kv_events_base_port=base + 2,
                              workers=1, kv_tier=KvTierSettings(enabled=True, port_base=listening_port))
    stack = Stack(settings, Path("unused-model"), "tiny-qwen2", state_dir=tmp_path, cache_dir=tmp_path)
    with pytest.raises(StackStartError, match=rf"{listening_port} \(KV tier master \(kv_tier.port_base\)\)"):
        stack.start()
    assert stack.children == []


def test_up_on_a_taken_front_door_port_fails_at_once_naming_it(listening_port, tmp_path):
    done = subprocess.run([sys.executable, "-m", "rollout_server.cli", "up", "--port", str(listening_port),
                           "--state-dir", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert f"port {listening_port} (the front door, --port) is already in use" in done.stderr
    assert not (tmp_path / "stack-8100").exists()  # no engine was started
