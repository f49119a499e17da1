"""One real stack (front door + Dynamo KV router + 2 vLLM workers) shared by the API tests."""

import openai
import pytest

from rollout_server.harness.stack import start_stack


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    # Seal trace records every second so exports see them quickly.
    running = start_stack(tmp_path_factory.mktemp("stack"), workers=2,
                          extra_env={"ROLLOUT_SERVE_TRACES__FLUSH_EVERY_S": "1"})
    yield running
    running.stop()


@pytest.fixture(scope="session")
def client(stack):
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused-in-open-mode", max_retries=0, timeout=120)
