"""The Batch API: upload validation with line numbers, team ownership, a 200-line batch through a
test double of the front door, restarts (clean and after a crash) answering every custom_id
exactly once, cancel, expiry, low priority (should_yield, max in flight) and file downloads."""

import asyncio
import json
import time

import pytest

from rollout_server.batch_runner import BatchRunner
from rollout_server.batches import BatchStore, LineResult, open_batch_database
from rollout_server.errors import APIError
from rollout_server.routes.batches import batches_router
from tests.usage.support import as_team, client_for, principal_from_test_header

CHAT = "/v1/chat/completions"
TERMINAL = ("completed", "cancelled", "expired", "failed")


class RecordingExecute:
    """Test double for the front door's handlers: answers at once, records each custom_id it ran
    (the tests put the line's custom_id in body["user"]), and counts requests running together."""

    def __init__(self, fail: set[str] = frozenset(), crash: set[str] = frozenset(), notify_after: int | None = None):
        self.fail = fail
        self.crash = crash
        self.calls: list[str] = []
        self.teams: set[str] = set()
        self.running = 0
        self.most_running = 0
        self.gate = asyncio.Event()       # closed by a test to hold requests in flight
        self.gate.set()
        self.notify_after = notify_after
        self.reached = asyncio.Event()    # set once notify_after requests have started

    async def __call__(self, url: str, body: dict, who) -> tuple[int, dict]:
        custom_id = body["user"]
        self.calls.append(custom_id)
        self.teams.add(who.team)
        if self.notify_after is not None and len(self.calls) >= self.notify_after:
            self.reached.set()
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await self.gate.wait()
            await asyncio.sleep(0)
        finally:
            self.running -= 1
        if custom_id in self.crash:
            raise RuntimeError("handler crashed")
        if custom_id in self.fail:
            return 400, {"error": {"message": "bad request", "type": "invalid_request_error", "param": None,
                                   "code": "invalid_value"}}
        return 200, {"id": f"chatcmpl-{custom_id}", "object": "chat.completion", "model": body["model"],
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": f"echo {custom_id}"},
                                  "finish_reason": "stop"}]}


def request_line(custom_id: str, url: str = CHAT, **overrides) -> dict:
    line = {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"model": "tiny-qwen2", "user": custom_id, "messages": [{"role": "user", "content": "hi"}]}}
    return {**line, **overrides}


def jsonl(lines: list) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()


def new_store(database_url: str, tmp_path) -> BatchStore:
    """A store as a (re)started process opens it: a fresh engine on the same database and directory."""
    return BatchStore(open_batch_database(database_url), tmp_path / "batches")


@pytest.fixture
def store(database_url, tmp_path):
    return new_store(database_url, tmp_path)


@pytest.fixture
def client(store):
    return client_for(batches_router(store, principal_from_test_header, max_file_bytes=1_000_000))


def upload(client, content: bytes, team: str = "team-a", purpose: str = "batch"):
    return client.post("/v1/files", files={"file": ("requests.jsonl", content, "application/jsonl")},
                       data={"purpose": purpose}, headers=as_team(team))


def create_batch(client, lines: list[dict], team: str = "team-a") -> dict:
    uploaded = upload(client, jsonl(lines), team)
    assert uploaded.status_code == 200, uploaded.text
    created = client.post("/v1/batches", json={"input_file_id": uploaded.json()["id"], "endpoint": CHAT,
                                               "completion_window": "24h"}, headers=as_team(team))
    assert created.status_code == 200, created.text
    return created.json()


def download_lines(client, file_id: str | None, team: str = "team-a") -> list[dict]:
    if file_id is None:
        return []
    response = client.get(f"/v1/files/{file_id}/content", headers=as_team(team))
    assert response.status_code == 200
    return [json.loads(line) for line in response.text.splitlines()]


async def wait_until_final(store: BatchStore, batch_id: str, timeout_s: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = await asyncio.to_thread(store.get_batch, batch_id, "team-a")
        if batch["status"] in TERMINAL:
            return batch
        await asyncio.sleep(0.02)
    raise AssertionError(f"batch {batch_id} did not finish: {batch}")


def fast_runner(store: BatchStore, execute, **options) -> BatchRunner:
    return BatchRunner(store, execute, poll_s=0.02, yield_sleep_s=0.02, **options)


# ---- upload and ownership --------------------------------------------------------------------

def test_upload_names_every_bad_line_and_stores_nothing(client, store):
    content = jsonl([
        request_line("ok-1"),
        '{"custom_id": "broken", ',                                   # 2: not JSON
        {"method": "POST", "url": CHAT, "body": {}},                  # 3: no custom_id
        request_line("get", method="GET"),                           # 4: not POST
        request_line("embed", url="/v1/embeddings"),                  # 5: unsupported url
        request_line("ok-1"),                                         # 6: repeated custom_id
        request_line("no-body", body="hello"),                        # 7: body not an object
        "",                                                           # 8: empty line
        request_line("extra", priority=1),                            # 9: unknown field
        request_line("\ud800"),                                       # 10: a lone surrogate (sqlite cannot store it)
        "[" * 100_000 + "]" * 100_000,                                # 11: nested deeper than a parser recurses
        request_line("a\u0000b"),                                    # 12: NUL (PostgreSQL text cannot hold it)
    ])
    response = upload(client, content)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_batch_input" and error["param"] == "file"
    for line_no, words in [(2, "not valid JSON (Expecting property name enclosed in double quotes at column"),
                           (3, "'custom_id' is missing"), (4, "method must be 'POST'"),
                           (5, "url '/v1/embeddings' is not supported"), (6, "custom_id 'ok-1' repeats line 1"),
                           (7, "'body' must be a JSON object"), (8, "empty line"), (9, "unknown field 'priority'"),
                           (10, "holds a lone UTF-16 surrogate"), (11, "not valid JSON (nested too deeply)"),
                           (12, "custom_id must not contain NUL")]:
        assert f"line {line_no}: {words}" in error["message"]
    assert "line 1:" not in error["message"]
    assert list(store.files_dir.iterdir()) == []

    wrong_purpose = upload(client, jsonl([request_line("a")]), purpose="fine-tune")
    assert wrong_purpose.status_code == 400 and wrong_purpose.json()["error"]["param"] == "purpose"


def test_files_and_batches_are_visible_to_their_team_only(client):
    content = jsonl([request_line("a"), request_line("b")])
    uploaded = upload(client, content).json()
    assert (uploaded["object"], uploaded["purpose"], uploaded["bytes"]) == ("file", "batch", len(content))
    assert client.get(f"/v1/files/{uploaded['id']}/content", headers=as_team("team-a")).content == content

    for path in (f"/v1/files/{uploaded['id']}", f"/v1/files/{uploaded['id']}/content"):
        assert client.get(path, headers=as_team("team-b")).status_code == 404
    stolen = client.post("/v1/batches", json={"input_file_id": uploaded["id"], "endpoint": CHAT,
                                              "completion_window": "24h"}, headers=as_team("team-b"))
    assert stolen.status_code == 404

    batch = client.post("/v1/batches", json={"input_file_id": uploaded["id"], "endpoint": CHAT,
                                             "completion_window": "24h", "metadata": {"run": "7"}},
                        headers=as_team("team-a")).json()
    assert (batch["object"], batch["status"], batch["request_counts"]) == (
        "batch", "in_progress", {"total": 2, "completed": 0, "failed": 0})
    assert batch["metadata"] == {"run": "7"}
    assert client.get(f"/v1/batches/{batch['id']}", headers=as_team("team-b")).status_code == 404
    assert client.post(f"/v1/batches/{batch['id']}/cancel", headers=as_team("team-b")).status_code == 404
    assert client.get("/v1/batches", headers=as_team("team-b")).json()["data"] == []
    assert [b["id"] for b in client.get("/v1/batches", headers=as_team("team-a")).json()["data"]] == [batch["id"]]


def test_batch_creation_checks_endpoint_and_window(client):
    file_id = upload(client, jsonl([request_line("a"), request_line("b", url="/v1/completions")])).json()["id"]
    mismatch = client.post("/v1/batches", json={"input_file_id": file_id, "endpoint": CHAT,
                                                "completion_window": "24h"}, headers=as_team("team-a"))
    assert mismatch.status_code == 400
    assert "line 2: url '/v1/completions' differs from the batch endpoint" in mismatch.json()["error"]["message"]
    window = client.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/completions",
                                              "completion_window": "1h"}, headers=as_team("team-a"))
    assert window.status_code == 400 and window.json()["error"]["param"] == "completion_window"


# ---- running ---------------------------------------------------------------------------------

def test_a_200_line_batch_answers_every_custom_id_once_in_openai_output_format(client, store):
    custom_ids = [f"req-{i:03d}" for i in range(200)]
    failing, crashing = {"req-013", "req-150"}, {"req-077"}
    batch = create_batch(client, [request_line(c) for c in custom_ids])
    execute = RecordingExecute(fail=failing, crash=crashing)

    async def run() -> dict:
        runner = fast_runner(store, execute, max_in_flight=8)
        await runner.start()
        final = await wait_until_final(store, batch["id"])
        await runner.stop()
        return final

    final = asyncio.run(run())
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 200, "completed": 197, "failed": 3}
    assert sorted(execute.calls) == custom_ids
    assert execute.teams == {"team-a"}
    assert 1 <= execute.most_running <= 8

    output = download_lines(client, final["output_file_id"])
    errors = download_lines(client, final["error_file_id"])
    assert [line["custom_id"] for line in output] == [c for c in custom_ids if c not in failing | crashing]
    assert sorted(line["custom_id"] for line in errors) == sorted(failing | crashing)
    first = output[0]
    assert set(first) == {"id", "custom_id", "response", "error"} and first["error"] is None
    assert first["id"].startswith("batch_req_")
    assert first["response"]["status_code"] == 200
    assert first["response"]["request_id"] == "chatcmpl-req-000"
    assert first["response"]["body"]["choices"][0]["message"]["content"] == "echo req-000"
    by_id = {line["custom_id"]: line for line in errors}
    assert by_id["req-013"]["response"]["status_code"] == 400
    assert by_id["req-077"]["response"]["status_code"] == 500
    assert by_id["req-077"]["response"]["body"]["error"]["message"].startswith("Internal error: RuntimeError")
    assert client.get(f"/v1/files/{final['output_file_id']}/content", headers=as_team("team-b")).status_code == 404


def test_restart_in_the_middle_and_after_a_crash_answers_every_custom_id_exactly_once(client, database_url,
                                                                                       tmp_path):
    custom_ids = [f"req-{i:03d}" for i in range(200)]
    batch = create_batch(client, [request_line(c) for c in custom_ids])
    first, second = RecordingExecute(notify_after=60), RecordingExecute()

    async def run_until_stopped_midway() -> None:
        runner = fast_runner(new_store(database_url, tmp_path), first, max_in_flight=4)
        await runner.start()
        await first.reached.wait()
        await runner.stop()          # clean stop: the lines in flight finish and are stored

    asyncio.run(run_until_stopped_midway())
    midway = new_store(database_url, tmp_path).get_batch(batch["id"], "team-a")
    assert midway["status"] == "in_progress"
    assert midway["request_counts"]["completed"] == len(first.calls) < 200

    # A crash: a runner claimed four lines (maybe even ran them) and died before storing results.
    crashed_store = new_store(database_url, tmp_path)
    abandoned = crashed_store.claim(4, time.time())
    crashed_store.engine.dispose()

    async def resume() -> dict:
        runner = fast_runner(new_store(database_url, tmp_path), second, max_in_flight=4)
        await runner.start()         # recovers the four abandoned lines
        final = await wait_until_final(runner.store, batch["id"])
        await runner.stop()
        return final

    final = asyncio.run(resume())
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 200, "completed": 200, "failed": 0}
    assert sorted(first.calls + second.calls) == custom_ids            # nothing ran twice
    assert {task.custom_id for task in abandoned} <= set(second.calls)
    output = download_lines(client, final["output_file_id"])
    assert [line["custom_id"] for line in output] == custom_ids        # each answered exactly once
    assert final["error_file_id"] is None


def test_a_late_result_for_a_line_that_is_no_longer_running_is_not_stored(store, client):
    create_batch(client, [request_line("a")])
    [task] = store.claim(1, time.time())
    assert store.finish_line(task, LineResult(200, {"id": "first"}), time.time()) is True
    assert store.finish_line(task, LineResult(200, {"id": "second"}), time.time()) is False


def test_cancel_finishes_lines_in_flight_and_skips_the_rest(client, store):
    custom_ids = [f"req-{i:02d}" for i in range(20)]
    batch = create_batch(client, [request_line(c) for c in custom_ids])

    async def run() -> tuple[dict, dict, RecordingExecute]:
        execute = RecordingExecute(notify_after=2)
        execute.gate.clear()                               # hold the first two requests in flight
        runner = fast_runner(store, execute, max_in_flight=2)
        await runner.start()
        await execute.reached.wait()
        cancelling = await asyncio.to_thread(client.post, f"/v1/batches/{batch['id']}/cancel",
                                             headers=as_team("team-a"))
        execute.gate.set()
        final = await wait_until_final(store, batch["id"])
        await runner.stop()
        return cancelling.json(), final, execute

    cancelling, final, execute = asyncio.run(run())
    assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"] is not None
    assert final["status"] == "cancelled" and final["cancelled_at"] is not None
    assert final["request_counts"] == {"total": 20, "completed": 2, "failed": 18}
    assert len(execute.calls) == 2
    output = download_lines(client, final["output_file_id"])
    errors = download_lines(client, final["error_file_id"])
    assert [line["custom_id"] for line in output] == execute.calls
    assert sorted(line["custom_id"] for line in output + errors) == custom_ids
    assert all(line["response"] is None and line["error"]["code"] == "batch_cancelled" for line in errors)

    again = client.post(f"/v1/batches/{batch['id']}/cancel", headers=as_team("team-a"))
    assert again.status_code == 200 and again.json()["status"] == "cancelled"


def test_a_completed_batch_cannot_be_cancelled(client, store):
    batch = create_batch(client, [request_line("a")])

    async def run() -> None:
        runner = fast_runner(store, RecordingExecute())
        await runner.start()
        await wait_until_final(store, batch["id"])
        await runner.stop()

    asyncio.run(run())
    refused = client.post(f"/v1/batches/{batch['id']}/cancel", headers=as_team("team-a"))
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "batch_not_cancellable"


def test_an_expired_batch_runs_nothing_and_reports_every_line_expired(client, store):
    batch = create_batch(client, [request_line(c) for c in ("a", "b", "c")])
    execute = RecordingExecute()

    async def run() -> dict:
        runner = fast_runner(store, execute, clock=lambda: time.time() + 25 * 3600)
        await runner.start()
        final = await wait_until_final(store, batch["id"])
        await runner.stop()
        return final

    final = asyncio.run(run())
    assert final["status"] == "expired" and final["output_file_id"] is None
    assert execute.calls == []
    errors = download_lines(client, final["error_file_id"])
    assert [(line["custom_id"], line["error"]["code"]) for line in errors] == [
        ("a", "batch_expired"), ("b", "batch_expired"), ("c", "batch_expired")]


def test_the_runner_starts_nothing_while_interactive_load_asks_it_to_yield(client, store):
    batch = create_batch(client, [request_line(f"req-{i}") for i in range(10)])
    execute = RecordingExecute()
    busy = {"interactive": True}

    async def run() -> tuple[int, dict]:
        runner = fast_runner(store, execute, should_yield=lambda: busy["interactive"])
        await runner.start()
        await asyncio.sleep(0.3)
        calls_while_busy = len(execute.calls)
        busy["interactive"] = False
        final = await wait_until_final(store, batch["id"])
        await runner.stop()
        return calls_while_busy, final

    calls_while_busy, final = asyncio.run(run())
    assert calls_while_busy == 0
    assert final["status"] == "completed" and len(execute.calls) == 10


def upload_named(client, filename: str):
    """An upload whose multipart header carries `filename` byte for byte (httpx would percent-encode a NUL)."""
    body = (b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            b'--b\r\nContent-Disposition: form-data; name="file"; filename="' + filename.encode() + b'"\r\n'
            b"Content-Type: application/jsonl\r\n\r\n" + jsonl([request_line("a")]) + b"\r\n--b--\r\n")
    return client.post("/v1/files", content=body,
                       headers={**as_team("team-a"), "content-type": "multipart/form-data; boundary=b"})


def test_a_file_name_no_database_can_store_is_refused(client, store):
    for name in ["x" * 513, "a\x00b.jsonl"]:
        response = upload_named(client, name)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "file" and "at most 512 characters" in response.text
    assert list(store.files_dir.iterdir()) == []
    longest = "x" * 512
    kept = upload_named(client, longest)
    assert kept.status_code == 200 and kept.json()["filename"] == longest


def test_an_upload_over_the_size_limit_is_refused(store):
    client = client_for(batches_router(store, principal_from_test_header, max_file_bytes=100))
    response = upload(client, jsonl([request_line("a"), request_line("b")]))
    assert response.status_code == 413 and response.json()["error"]["code"] == "file_too_large"


def test_unknown_ids_are_404_in_the_openai_error_shape(client, store):
    response = client.get("/v1/batches/batch_nope", headers=as_team("team-a"))
    assert response.status_code == 404 and response.json()["error"]["code"] == "batch_not_found"
    with pytest.raises(APIError):
        store.get_file("file-nope", "team-a")
    unknown_input = client.post("/v1/batches", json={"input_file_id": "file-nope", "endpoint": CHAT,
                                                     "completion_window": "24h"}, headers=as_team("team-a"))
    assert (unknown_input.status_code, unknown_input.json()["error"]["param"]) == (404, "input_file_id")


def test_finalize_leaves_a_batch_that_is_not_ready_alone(client, store):
    batch = create_batch(client, [request_line("a"), request_line("b")])
    assert store.finalize(batch["id"], time.time()) == "in_progress"      # lines still pending, not expired
    [task, _] = store.claim(2, time.time())
    store.finish_line(task, LineResult(200, {"id": "x"}), time.time())
    assert store.finalize(batch["id"], time.time() + 25 * 3600) == "in_progress"   # one line still running
    assert store.get_batch(batch["id"], "team-a")["request_counts"] == {"total": 2, "completed": 1, "failed": 0}
