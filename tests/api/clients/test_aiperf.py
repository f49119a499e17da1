"""aiperf, NVIDIA's serving benchmark, profiles the front door as users point it: streaming chat.

A smoke test, not a measurement: a few requests through `aiperf profile` from its own venv
(tests/api/clients/venvs.py), its JSON export read back: every request completed, none failed.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from rollout_server.tiny_model.builder import TINY_MODEL_NAME
from tests.api.clients.venvs import AIPERF_VENV, client_command
from tests.tiny_models import trained_tiny_model

pytestmark = pytest.mark.stack

REQUESTS = 8


def test_aiperf_profiles_streaming_chat_with_no_errors(stack, tmp_path):
    # The tokenizer is a local directory: with it aiperf reaches nothing beyond the server. Its offline mode
    # (HF_HUB_OFFLINE, which tests/conftest.py sets) refuses a local directory, so it is left out.
    env = {name: value for name, value in os.environ.items() if name not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    command = [str(client_command(AIPERF_VENV, "aiperf")), "profile", "--model", TINY_MODEL_NAME, "--url", stack.url,
               "--endpoint-type", "chat", "--streaming", "--tokenizer", str(trained_tiny_model()),
               "--request-count", str(REQUESTS), "--concurrency", "2", "--isl", "64", "--osl", "16",
               "--random-seed", "0", "--ui", "none", "--no-gpu-telemetry", "--artifact-dir", str(tmp_path)]
    done = subprocess.run(command, env=env, check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "profile_export_aiperf.json").read_text())
    assert summary["is_complete"] and not summary["was_cancelled"]
    assert summary["request_count"]["avg"] == REQUESTS
    assert summary["completed_request_count"]["avg"] == REQUESTS
    assert summary["error_summary"] == []
    # The server's own metrics were scraped too (aiperf reads /metrics during the run).
    assert (tmp_path / "server_metrics_export.json").exists()
