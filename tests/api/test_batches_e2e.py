"""The Batch API runs its lines through the real stack, and usage is recorded per request."""

import json
import time

import httpx
import pytest

pytestmark = pytest.mark.stack


def test_a_batch_of_chat_and_completion_lines_runs_to_completion(stack):
    lines = [{"custom_id": f"chat-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "tiny-qwen2", "messages": [{"role": "user", "content": f"line {i}"}], "max_tokens": 4}}
             for i in range(4)]
    lines.append({"custom_id": "bad", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": "tiny-qwen2", "messages": [{"role": "user", "content": "x"}], "max_tokens": 99999}})
    upload = httpx.post(f"{stack.url}/v1/files", data={"purpose": "batch"}, timeout=30,
                        files={"file": ("batch.jsonl", "\n".join(json.dumps(line) for line in lines).encode())})
    assert upload.status_code == 200, upload.text
    batch = httpx.post(f"{stack.url}/v1/batches", timeout=30, json={
        "input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}).json()
    deadline = time.monotonic() + 120
    while batch["status"] not in ("completed", "failed", "cancelled") and time.monotonic() < deadline:
        time.sleep(1)
        batch = httpx.get(f"{stack.url}/v1/batches/{batch['id']}", timeout=30).json()
    assert batch["status"] == "completed", batch
    assert batch["request_counts"] == {"total": 5, "completed": 4, "failed": 1}

    output = httpx.get(f"{stack.url}/v1/files/{batch['output_file_id']}/content", timeout=30).text.splitlines()
    answers = {row["custom_id"]: row for row in map(json.loads, output)}
    assert sorted(answers) == ["chat-0", "chat-1", "chat-2", "chat-3"]
    for row in answers.values():
        assert row["response"]["status_code"] == 200
        assert row["response"]["body"]["choices"][0]["message"]["role"] == "assistant"
        assert row["response"]["body"]["usage"]["completion_tokens"] >= 1
    errors = [json.loads(line) for line in
              httpx.get(f"{stack.url}/v1/files/{batch['error_file_id']}/content", timeout=30).text.splitlines()]
    assert [e["custom_id"] for e in errors] == ["bad"]
    assert errors[0]["response"]["status_code"] == 400


def test_usage_reports_the_requests_served(stack, client):
    before = httpx.get(f"{stack.url}/v1/usage", timeout=30).json()
    reply = client.chat.completions.create(model="tiny-qwen2", messages=[{"role": "user", "content": "count me"}],
                                           max_tokens=5)
    deadline = time.monotonic() + 15  # usage is flushed to the database every second
    while time.monotonic() < deadline:
        after = httpx.get(f"{stack.url}/v1/usage", timeout=30).json()
        if total(after, "requests") > total(before, "requests"):
            break
        time.sleep(0.5)
    assert total(after, "requests") - total(before, "requests") >= 1
    assert total(after, "completion_tokens") - total(before, "completion_tokens") >= reply.usage.completion_tokens


def total(usage: dict, field: str) -> int:
    return sum(row[field] for row in usage["data"])
