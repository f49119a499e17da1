"""A stack of its own: a 200-request batch survives a restart of the server; every request is answered
exactly once (the output names each custom_id once, and usage counts exactly 200 requests run)."""

import json
import time

import httpx
import pytest

from rollout_server.harness.stack import create_key, start_stack

pytestmark = pytest.mark.stack

LINES = 200


def batch_status(url: str, batch_id: str, key: str) -> dict:
    return httpx.get(f"{url}/v1/batches/{batch_id}", headers={"Authorization": f"Bearer {key}"}, timeout=30).json()


def test_a_200_request_batch_completes_across_a_server_restart_answering_each_once(tmp_path):
    database_url = f"sqlite:///{tmp_path / 'keys.db'}"
    key = create_key(database_url, "batch-team")
    headers = {"Authorization": f"Bearer {key}"}
    args = ["--database-url", database_url]
    lines = [{"custom_id": f"req-{i:03d}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "tiny-qwen2", "messages": [{"role": "user", "content": f"line {i}"}], "max_tokens": 8}}
             for i in range(LINES)]

    stack = start_stack(tmp_path, extra_args=args)
    try:
        upload = httpx.post(f"{stack.url}/v1/files", data={"purpose": "batch"}, headers=headers, timeout=30,
                            files={"file": ("batch.jsonl", "\n".join(map(json.dumps, lines)).encode())})
        assert upload.status_code == 200, upload.text
        batch = httpx.post(f"{stack.url}/v1/batches", headers=headers, timeout=30, json={
            "input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}).json()
        deadline = time.monotonic() + 300
        while batch_status(stack.url, batch["id"], key)["request_counts"]["completed"] < 20:
            assert time.monotonic() < deadline, "the batch did not start"
            time.sleep(0.2)
    finally:
        assert stack.stop() == 0, stack.log_tail()   # SIGTERM: the lines in flight finish and are stored

    stack = start_stack(tmp_path, extra_args=args)   # same state directory: the batch store is on disk
    try:
        midway = batch_status(stack.url, batch["id"], key)
        assert midway["request_counts"]["completed"] < LINES, "the batch finished before the restart: nothing tested"
        deadline = time.monotonic() + 600
        while (final := batch_status(stack.url, batch["id"], key))["status"] != "completed":
            assert final["status"] in ("validating", "in_progress", "finalizing"), final
            assert time.monotonic() < deadline, final
            time.sleep(1)
        assert final["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0}
        output = httpx.get(f"{stack.url}/v1/files/{final['output_file_id']}/content", headers=headers, timeout=30)
        answered = [json.loads(line)["custom_id"] for line in output.text.splitlines()]
        assert sorted(answered) == [line["custom_id"] for line in lines]        # each exactly once

        def requests_run() -> int:
            rows = httpx.get(f"{stack.url}/v1/usage", headers=headers, timeout=30).json()["data"]
            return sum(row["requests"] for row in rows)

        deadline = time.monotonic() + 30     # usage is flushed every second
        while requests_run() < LINES and time.monotonic() < deadline:
            time.sleep(0.5)
        assert requests_run() == LINES, "a batch line ran twice, or a run was not recorded"
    finally:
        stack.stop()
