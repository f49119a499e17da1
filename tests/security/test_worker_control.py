"""Worker control reachable only by the front door: a worker's admin routes (pause, load weights, LoRA, ...) are
not served on its system port, and its control socket refuses a call without the deployment's token
(engine/control_access.py); the worker keeps serving through every refused call."""

import stat
from pathlib import Path

import httpx
import pytest

from rollout_server.harness.stack import RunningStack
from tests.security.conftest import run_dir, stream_completion

pytestmark = pytest.mark.stack


def control_socket(stack: RunningStack, worker: int = 0) -> Path:
    return run_dir(stack) / "control" / f"worker-{worker}.sock"


def test_the_system_port_serves_no_admin_route(served_stack):
    port = served_stack.worker_system_port(0)
    response = httpx.post(f"http://127.0.0.1:{port}/engine/pause_generation", json={"mode": "abort"}, timeout=30)
    assert response.status_code == 404, response.text
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["status"] == "ready"
    assert "dynamo_component" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    assert stream_completion(served_stack.url, served_stack.model)


@pytest.mark.parametrize("authorization", [None, "Bearer not-the-token", "Bearer"])
def test_the_control_socket_refuses_a_call_without_the_token(served_stack, authorization):
    headers = {"Authorization": authorization} if authorization is not None else {}
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(control_socket(served_stack))), timeout=30) as http:
        response = http.post("http://worker/engine/pause_generation", json={"mode": "abort"}, headers=headers)
    assert response.status_code == 401, response.text
    assert stream_completion(served_stack.url, served_stack.model), "a refused call paused the worker"


def test_only_the_front_doors_user_can_open_the_control_socket(served_stack):
    socket_path = control_socket(served_stack)
    assert stat.S_IMODE(socket_path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(socket_path.stat().st_mode) == 0o600
