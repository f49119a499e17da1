"""Retention of the Batch API's files (rollout_server/batches.py, BatchStore.sweep): a team over its byte budget loses
its oldest files only, files older than the age go, a file an active batch uses never goes, and a swept file (or one
whose bytes vanished under its row) is a 404 naming the file, never a 500. The real BatchStore on SQLite."""

import asyncio
import time

import pytest
from sqlalchemy import update

from rollout_server.batches import batch_files
from rollout_server.metrics import Metrics
from rollout_server.routes.batches import batches_router
from tests.usage.support import as_team, client_for, principal_from_test_header
from tests.usage.test_batches import (
    CHAT,
    RecordingExecute,
    fast_runner,
    jsonl,
    new_store,
    request_line,
    upload,
    wait_until_final,
)

DAY_S = 86400


@pytest.fixture
def store(database_url, tmp_path):
    return new_store(database_url, tmp_path)


@pytest.fixture
def client(store):
    return client_for(batches_router(store, principal_from_test_header, max_file_bytes=1_000_000))


def upload_aged(client, store, team: str, days_old: float, custom_id: str = "a") -> dict:
    """An uploaded file whose created_at is days_old days ago."""
    uploaded = upload(client, jsonl([request_line(custom_id)]), team)
    assert uploaded.status_code == 200, uploaded.text
    with store.engine.begin() as conn:
        conn.execute(update(batch_files).where(batch_files.c.id == uploaded.json()["id"])
                     .values(created_at=time.time() - days_old * DAY_S))
    return uploaded.json()


def kept(client, store, file: dict, team: str) -> bool:
    """Whether the file's row and its bytes are both still there (a swept file loses both)."""
    on_disk = store.path_of(file["id"]).exists()
    listed = client.get(f"/v1/files/{file['id']}", headers=as_team(team)).status_code == 200
    assert on_disk == listed, f"{file['id']}: row {'kept' if listed else 'gone'} but file {'kept' if on_disk else 'gone'}"
    return listed


def assert_file_not_found(response, param: str = "file_id") -> None:
    assert response.status_code == 404, response.text
    assert response.json()["error"]["code"] == "file_not_found"
    assert response.json()["error"]["param"] == param


def test_a_team_over_its_byte_budget_loses_its_oldest_files_and_no_other_teams(client, store):
    a_files = [upload_aged(client, store, "team-a", days_old) for days_old in (3, 2, 1)]    # oldest first
    b_files = [upload_aged(client, store, "team-b", days_old) for days_old in (9, 8)]       # older than all of a's
    budget = 2 * a_files[0]["bytes"]   # every file is as large: team-a holds one too many, team-b none

    swept = store.sweep(retention_days=None, bytes_per_team=budget)

    assert [kept(client, store, f, "team-a") for f in a_files] == [False, True, True]
    assert [kept(client, store, f, "team-b") for f in b_files] == [True, True]
    assert (swept.files_removed, swept.bytes_removed, dict(swept.by_team)) == (1, a_files[0]["bytes"], {"team-a": 1})


def test_files_older_than_the_retention_age_are_removed(client, store):
    old, young = upload_aged(client, store, "team-a", 31), upload_aged(client, store, "team-a", 29)

    assert store.sweep(retention_days=30, bytes_per_team=None).files_removed == 1

    assert not kept(client, store, old, "team-a")
    assert kept(client, store, young, "team-a")


def test_a_file_an_active_batch_uses_is_never_removed_and_the_batch_keeps_its_record(client, store):
    in_use, idle = upload_aged(client, store, "team-a", 40), upload_aged(client, store, "team-a", 40, "b")
    created = client.post("/v1/batches", json={"input_file_id": in_use["id"], "endpoint": CHAT,
                                               "completion_window": "24h"}, headers=as_team("team-a"))
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]

    # Too old and over a 1-byte budget, yet its batch is in progress: only the idle file goes.
    assert store.sweep(retention_days=30, bytes_per_team=1).files_removed == 1
    assert kept(client, store, in_use, "team-a")
    assert not kept(client, store, idle, "team-a")
    client.post(f"/v1/batches/{batch_id}/cancel", headers=as_team("team-a"))   # cancelling: still active
    assert store.sweep(retention_days=30, bytes_per_team=1).files_removed == 0
    assert kept(client, store, in_use, "team-a")

    async def finalize() -> dict:
        runner = fast_runner(store, RecordingExecute())
        await runner.start()
        final = await wait_until_final(store, batch_id)
        await runner.stop()
        return final

    final = asyncio.run(finalize())
    assert final["status"] == "cancelled" and final["error_file_id"] is not None

    # Final: nothing holds its files any more; the batch keeps its record and the ids, each a 404 now.
    assert store.sweep(retention_days=None, bytes_per_team=1).files_removed == 2   # the input and the error file
    batch = client.get(f"/v1/batches/{batch_id}", headers=as_team("team-a"))
    assert batch.status_code == 200 and batch.json()["input_file_id"] == in_use["id"]
    for file_id in (in_use["id"], final["error_file_id"]):
        assert_file_not_found(client.get(f"/v1/files/{file_id}/content", headers=as_team("team-a")))


def test_a_swept_file_is_a_404_naming_it_in_every_route_that_reads_it(client, store):
    swept = upload_aged(client, store, "team-a", 31)
    store.sweep(retention_days=30, bytes_per_team=None)

    assert_file_not_found(client.get(f"/v1/files/{swept['id']}", headers=as_team("team-a")))
    assert_file_not_found(client.get(f"/v1/files/{swept['id']}/content", headers=as_team("team-a")))
    created = client.post("/v1/batches", json={"input_file_id": swept["id"], "endpoint": CHAT,
                                               "completion_window": "24h"}, headers=as_team("team-a"))
    assert_file_not_found(created, param="input_file_id")


def test_a_file_whose_bytes_vanished_under_its_row_is_a_404_not_a_500(client, store):
    # A sweep removing a file between a route's lookup of its row and its read of the bytes, as an operator's rm.
    file = upload_aged(client, store, "team-a", 0)
    store.path_of(file["id"]).unlink()

    assert_file_not_found(client.get(f"/v1/files/{file['id']}/content", headers=as_team("team-a")))
    created = client.post("/v1/batches", json={"input_file_id": file["id"], "endpoint": CHAT,
                                               "completion_window": "24h"}, headers=as_team("team-a"))
    assert_file_not_found(created, param="input_file_id")
    assert client.get("/v1/batches", headers=as_team("team-a")).json()["data"] == []


def test_the_runner_sweeps_at_start_and_metrics_count_the_files_removed(client, store):
    old = upload_aged(client, store, "team-a", 31)
    runner = fast_runner(store, RecordingExecute(), retention_days=30, retention_bytes_per_team=None)
    metrics = Metrics()
    metrics.watch_batches(lambda: runner.files_expired)

    async def run_until_swept() -> None:
        await runner.start()
        deadline = time.monotonic() + 10
        while runner.files_expired == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await runner.stop()

    asyncio.run(run_until_swept())

    assert runner.files_expired == 1
    assert not kept(client, store, old, "team-a")
    assert b"rollout_batch_files_expired 1.0" in metrics.render()
