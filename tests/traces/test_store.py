import shutil

import pyarrow.parquet as pq
from trace_factory import make_record

from trace_pipeline import codec
from trace_pipeline.store import TraceStore
from trace_pipeline.wal import encode_frames, read_frames


def stored_ids(store: TraceStore, team: str = "team-a") -> list[str]:
    return sorted(store.read_table(team, columns=["request_id"])["request_id"].to_pylist())


def test_reading_a_wal_stops_at_a_torn_tail(tmp_path):
    path = tmp_path / "x.wal"
    frames = encode_frames([b"one", b"two", b"three"])
    path.write_bytes(frames + encode_frames([b"four-never-finished"])[:-5])
    assert list(read_frames(path)) == [b"one", b"two", b"three"]


def test_reading_a_wal_stops_at_a_corrupt_frame(tmp_path):
    path = tmp_path / "x.wal"
    data = bytearray(encode_frames([b"one", b"two"]))
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert list(read_frames(path)) == [b"one"]


def test_recovery_seals_the_segment_of_a_dead_writer_exactly(tmp_path, sealed):
    store = TraceStore(tmp_path, **sealed)
    records = [make_record(f"r{i}", prompt=[i, 2**40 + i], completion=[7, 8, 9],
                           logprobs=[-0.1 * i, -1e-9, -12.5]) for i in range(5)]
    segment = store.new_segment()
    segment.append([codec.encode(r) for r in records])
    segment.close()    # the writer dies here, before sealing
    assert stored_ids(store) == []

    assert TraceStore(tmp_path, **sealed).recover() == 5
    table = store.read_table("team-a").sort_by("request_id")
    assert table["request_id"].to_pylist() == [r.request_id for r in records]
    assert table["prompt_token_ids"].to_pylist() == [r.prompt_token_ids for r in records]
    assert table["completion_logprobs"].to_pylist() == [r.completion_logprobs for r in records]
    assert list(store.wal_dir.glob("*.wal")) == []


def test_recovery_leaves_a_live_writers_segment_alone(tmp_path, sealed):
    store = TraceStore(tmp_path, **sealed)
    segment = store.new_segment()
    segment.append([codec.encode(make_record("live"))])
    assert TraceStore(tmp_path, **sealed).recover() == 0
    assert segment.path.exists()
    segment.close()
    assert TraceStore(tmp_path, **sealed).recover() == 1
    assert stored_ids(store) == ["live"]


def test_sealing_a_segment_again_after_a_crash_duplicates_nothing(tmp_path, sealed):
    store = TraceStore(tmp_path, **sealed)
    records = [make_record(f"r{i}") for i in range(3)]
    segment = store.new_segment()
    segment.append([codec.encode(r) for r in records])
    segment.close()
    kept = tmp_path / "kept.wal"
    shutil.copy(segment.path, kept)
    store.seal(segment.path, records)
    shutil.copy(kept, segment.path)   # as if the crash came between rename and WAL delete
    assert store.recover() == 3
    assert stored_ids(store) == ["r0", "r1", "r2"]


def test_sealed_files_are_zstd_parquet_partitioned_by_date_model_and_policy_version(tmp_path, sealed):
    store = TraceStore(tmp_path, **sealed)
    rec = make_record("r1", model="org/model-7b", policy_version=3, created_at=1_700_000_000.0)
    segment = store.new_segment()
    segment.append([codec.encode(rec)])
    segment.close()
    store.seal(segment.path, [rec])
    [sealed_file] = store.sealed_files()
    assert store.sealed.relative(sealed_file.path).split("/") == [
        "date=2023-11-14", "model=org%2Fmodel-7b", "policy_version=3", f"{segment.path.stem}.parquet"]
    parquet = pq.ParquetFile(store.sealed.fs.open_input_file(sealed_file.path))
    assert parquet.metadata.row_group(0).column(0).compression == "ZSTD"
    assert [f.path for f in store.sealed_files(model="org/model-7b", policy_version=3)] == [sealed_file.path]
    assert store.sealed_files(policy_version=4) == []
    assert store.sealed_files(since=1_800_000_000.0) == []
