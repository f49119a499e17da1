"""Sealed traces in an S3-compatible object store (traces.sealed_uri = s3://bucket/prefix), against a real server
(moto's, tests/traces/conftest.py): the writer seals there, exports and retention read there, the WAL stays local,
and an unreachable store costs no acknowledged record. The store and export tests run on S3 too (the `sealed`
fixture); these are the ones only S3 has."""
import time
import uuid

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from conftest import BUCKET
from trace_factory import make_record

from rollout_server.harness.s3_server import S3Server, free_port
from trace_pipeline import codec
from trace_pipeline.capture import TraceCapture
from trace_pipeline.export import FORMATS, export
from trace_pipeline.retention import DAY_S, sweep
from trace_pipeline.settings import S3Settings, TraceSettings
from trace_pipeline.store import TraceStore
from trace_pipeline.wal import read_frames

T0 = 1_700_000_000.0
NOW = T0 + 40 * DAY_S


def records():
    """Two sessions of team-a (one continues its first turn) over two models, and one record of team-b."""
    return [make_record("t1", session_id="s1", prompt=[1, 2], completion=[3], created_at=T0),
            make_record("t2", session_id="s1", prompt=[1, 2, 3, 4], completion=[5, 6], created_at=T0 + 1),
            make_record("o1", session_id="s2", model="org/other", policy_version=2, created_at=T0 + 2),
            make_record("b1", session_id="s3", team="team-b", created_at=T0 + 3)]


def s3_settings(s3_server: S3Server, tmp_path, **overrides) -> TraceSettings:
    """A store whose WAL is under tmp_path and whose sealed files go to a fresh prefix of the bucket; it keeps
    records of any age (the records are from 2023) unless a test says otherwise."""
    overrides = {"retention_days": None, **overrides}
    return TraceSettings(dir=tmp_path / "store", sealed_uri=f"s3://{BUCKET}/{uuid.uuid4().hex}",
                         s3=s3_server.settings(), flush_every_s=60, **overrides)


def objects(s3_server: S3Server, uri: str) -> dict[str, int]:
    """The objects under an s3:// prefix as the server lists them to a client of its own: key under it -> size."""
    prefix = uri.removeprefix("s3://")
    listing = s3_server.filesystem().get_file_info(pafs.FileSelector(prefix, recursive=True, allow_not_found=True))
    return {info.path.removeprefix(prefix + "/"): info.size for info in listing if info.type == pafs.FileType.File}


def write_through_capture(settings: TraceSettings) -> TraceCapture:
    capture = TraceCapture(settings)
    capture.start()
    for rec in records():
        capture.record_sync(rec)
    capture.close()
    return capture


def test_the_writer_seals_whole_objects_into_the_bucket_and_exports_match_a_local_store(s3_server, tmp_path):
    settings = s3_settings(s3_server, tmp_path)
    capture = write_through_capture(settings)
    local = write_through_capture(TraceSettings(dir=tmp_path / "local", flush_every_s=60, retention_days=None))

    stored = objects(s3_server, settings.sealed_uri)
    # One object per partition, named after the segment, at its final key; no temp object, nothing local.
    segment = next(iter(stored)).split("/")[-1]
    assert sorted(stored) == [f"date=2023-11-14/model=org%2Fmodel-7b/policy_version=1/{segment}",
                              f"date=2023-11-14/model=org%2Fother/policy_version=2/{segment}"]
    assert all(size > 0 for size in stored.values())
    assert capture.stats["sealed"] == 4 and capture.stats["seal_errors"] == 0
    assert list(capture.store.wal_dir.iterdir()) == [] and not (settings.dir / "traces").exists()

    for fmt in FORMATS:
        for team in ("team-a", "team-b"):
            from_s3 = tmp_path / "out-s3" / fmt / team
            from_local = tmp_path / "out-local" / fmt / team
            assert export(TraceStore.from_settings(settings), from_s3, fmt, team, progress=False) > 0
            assert export(local.store, from_local, fmt, team, progress=False) > 0
            assert pq.read_table(from_s3).equals(pq.read_table(from_local)), f"{fmt} export of {team} differs"


def test_recovery_after_a_crash_between_wal_and_seal_seals_into_the_bucket(s3_server, tmp_path):
    settings = s3_settings(s3_server, tmp_path)
    store = TraceStore.from_settings(settings)
    segment = store.new_segment()
    segment.append([codec.encode(r) for r in records()])
    segment.close()   # the writer dies here: acknowledged, never sealed
    assert objects(s3_server, settings.sealed_uri) == {}

    capture = TraceCapture(settings)
    capture.start()   # recovery
    capture.close()

    assert capture.stats["recovered"] == 4
    assert len(objects(s3_server, settings.sealed_uri)) == 2
    assert sorted(store.read_table("team-a", columns=["request_id"])["request_id"].to_pylist()) == ["o1", "t1", "t2"]
    assert list(store.wal_dir.glob("*.wal")) == []


def test_retention_rewrites_and_deletes_objects_in_the_bucket(s3_server, tmp_path):
    settings = s3_settings(s3_server, tmp_path, retention_days=30, retention_bytes_per_team=None)
    store = TraceStore.from_settings(settings)
    old, young = NOW - 30 * DAY_S - 100, NOW - 30 * DAY_S + 100   # one day: one partition holds both
    store.seal(store.wal_dir / "seg-old.wal", [make_record("old-1", created_at=old),
                                                make_record("old-2", created_at=old)])
    store.seal(store.wal_dir / "seg-mixed.wal", [make_record("old-3", created_at=old),
                                                  make_record("young-1", created_at=young)])
    before = objects(s3_server, settings.sealed_uri)
    assert sorted(key.split("/")[-1] for key in before) == ["seg-mixed.parquet", "seg-old.parquet"]

    swept = sweep(store, settings, now=NOW)

    after = objects(s3_server, settings.sealed_uri)
    assert [key.split("/")[-1] for key in after] == ["seg-mixed.parquet"], "the all-old object is deleted"
    [mixed] = after
    assert after[mixed] != before[mixed], "the mixed object is rewritten without its old row"
    rewritten = pq.read_table(f"{settings.sealed_uri.removeprefix('s3://')}/{mixed}",
                              filesystem=s3_server.filesystem())
    assert rewritten["request_id"].to_pylist() == ["young-1"]
    assert swept.traces_removed == 3


def test_an_unreachable_store_loses_no_acknowledged_record_and_sealing_retries(tmp_path):
    port = free_port()   # nothing listens here yet
    settings = TraceSettings(dir=tmp_path / "store", sealed_uri=f"s3://{BUCKET}/down",
                             s3=S3Server.settings_for(port), flush_every_s=0.1, seal_retry_s=0.2,
                             retention_days=None)
    capture = TraceCapture(settings)
    capture.start()
    try:
        for rec in records():
            capture.record_sync(rec)   # durable ack: in the WAL
        wait_for(lambda: capture.stats["seal_errors"] >= 2, "sealing to fail, then fail again on its own")
        in_wal = [codec.decode_trace(payload).request_id
                  for path in capture.store.wal_dir.glob("*.wal") for payload in read_frames(path)]
        assert sorted(in_wal) == ["b1", "o1", "t1", "t2"], "the WAL keeps every acknowledged record"
        assert capture.stats["sealed"] == 0

        with S3Server.running(port) as server:   # the store comes back
            server.create_bucket(BUCKET)
            wait_for(lambda: capture.stats["sealed"] == 4, "the sealer's retry, with no new record")
            assert list(capture.store.wal_dir.glob("*.wal")) == []
            assert len(objects(server, settings.sealed_uri)) == 2
            ids = capture.store.read_table("team-a", columns=["request_id"])["request_id"].to_pylist()
            assert sorted(ids) == ["o1", "t1", "t2"]
    finally:
        capture.close()


def wait_for(condition, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def test_a_sealed_uri_must_be_a_local_directory_or_an_s3_bucket():
    with pytest.raises(ValueError, match="local directory or s3://"):
        TraceSettings(sealed_uri="gs://bucket/prefix")
    with pytest.raises(ValueError, match="must name a bucket"):
        TraceSettings(sealed_uri="s3://")
    with pytest.raises(ValueError, match="absolute"):
        TraceSettings(sealed_uri="relative/dir")
    with pytest.raises(ValueError, match="http"):
        S3Settings(endpoint_url="127.0.0.1:9000")
