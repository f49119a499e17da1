"""One real stack (front door, Dynamo frontend, one vLLM worker) shared by the stack-tier security tests."""

from pathlib import Path

import httpx
import pytest

from rollout_server.harness.stack import RunningStack, start_stack


def run_dir(stack: RunningStack) -> Path:
    """The default deployment's run directory (engine/supervisor/stack.py: named after the frontend's port)."""
    return stack.state_dir / f"stack-{stack.frontend_url.rsplit(':', 1)[1]}"


def stream_completion(url: str, model: str) -> str:
    """A short streamed completion through the front door: its text (the stack serves end to end)."""
    text = []
    with httpx.stream("POST", f"{url}/v1/completions", timeout=120,
                      json={"model": model, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0,
                            "stream": True}) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                text.append(httpx.Response(200, content=line[6:]).json()["choices"][0]["text"])
    return "".join(text)


@pytest.fixture(scope="session")
def served_stack(tmp_path_factory):
    """The stack after one request has been served (the front door's in-process router starts with the first)."""
    stack = start_stack(tmp_path_factory.mktemp("security-stack"), workers=1)
    try:
        stream_completion(stack.url, stack.model)
        yield stack
    finally:
        stack.stop()
