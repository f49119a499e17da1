import asyncio
import threading
import time

from trace_factory import make_record

from trace_pipeline import codec
from trace_pipeline.capture import TraceCapture
from trace_pipeline.settings import TraceSettings
from trace_pipeline.store import TraceStore
from trace_pipeline.wal import read_frames


class GatedRedactorDouble:
    """Test double: a redaction hook that holds the writer thread until the gate opens."""

    def __init__(self):
        self.gate = threading.Event()

    def __call__(self, rec):
        if threading.current_thread().name == "trace-writer":
            self.gate.wait(timeout=30)
        return rec


def wal_request_ids(store: TraceStore) -> set[str]:
    return {codec.decode_trace(p).request_id
            for path in store.wal_dir.glob("*.wal") for p in read_frames(path)}


def stored_ids(store: TraceStore) -> list[str]:
    return sorted(store.read_table("team-a", columns=["request_id"])["request_id"].to_pylist())


def settings(tmp_path, **overrides) -> TraceSettings:
    return TraceSettings(dir=tmp_path / "store", flush_every_s=60, **overrides)


def test_record_returns_once_the_record_is_in_the_wal(tmp_path):
    capture = TraceCapture(settings(tmp_path))
    capture.start()

    async def record_many():
        await asyncio.gather(*(capture.record(make_record(f"r{i}")) for i in range(50)))

    asyncio.run(record_many())
    assert wal_request_ids(capture.store) == {f"r{i}" for i in range(50)}   # durable, not sealed yet
    assert stored_ids(capture.store) == []
    capture.close()
    assert stored_ids(capture.store) == sorted(f"r{i}" for i in range(50))
    assert wal_request_ids(capture.store) == set()
    assert capture.stats["written"] == capture.stats["sealed"] == 50


def test_writer_seals_to_parquet_every_flush_every_records(tmp_path):
    capture = TraceCapture(settings(tmp_path, flush_every_records=10))
    capture.start()
    for i in range(25):
        capture.record_sync(make_record(f"r{i:02d}"))
    deadline = time.monotonic() + 10
    while len(stored_ids(capture.store)) < 20 and time.monotonic() < deadline:
        time.sleep(0.02)   # the sealer thread works in the background
    assert len(stored_ids(capture.store)) == 20   # two full seals, the rest waits for close()
    capture.close()
    assert stored_ids(capture.store) == [f"r{i:02d}" for i in range(25)]


def test_full_queue_with_block_policy_waits_without_blocking_the_loop(tmp_path):
    gated = GatedRedactorDouble()
    capture = TraceCapture(settings(tmp_path, queue_size=2, ack="enqueue", full_policy="block"),
                           redactor=gated)
    capture.start()

    async def scenario():
        for i in range(3):   # one held by the gated writer, two fill the queue
            await capture.record(make_record(f"r{i}"))
            await asyncio.sleep(0.05)
        blocked = asyncio.create_task(capture.record(make_record("r3")))
        await asyncio.sleep(0.3)   # the loop keeps running while r3 waits
        assert not blocked.done()
        assert capture.stats["blocked_waits"] == 1
        gated.gate.set()
        await asyncio.wait_for(blocked, timeout=10)

    asyncio.run(scenario())
    capture.close()
    assert stored_ids(capture.store) == ["r0", "r1", "r2", "r3"]
    assert capture.stats["spilled"] == 0


def test_full_queue_with_spill_policy_writes_durably_to_disk(tmp_path):
    gated = GatedRedactorDouble()
    capture = TraceCapture(settings(tmp_path, queue_size=2, ack="enqueue", full_policy="spill"),
                           redactor=gated)
    capture.start()

    async def scenario():
        for i in range(3):
            await capture.record(make_record(f"r{i}"))
            await asyncio.sleep(0.05)
        for i in range(3, 6):
            await asyncio.wait_for(capture.record(make_record(f"r{i}")), timeout=10)

    asyncio.run(scenario())
    assert capture.stats["spilled"] == 3
    spill_ids = {codec.decode_trace(p).request_id
                 for path in capture.store.wal_dir.glob("spill-*.wal") for p in read_frames(path)}
    assert spill_ids == {"r3", "r4", "r5"}
    gated.gate.set()
    capture.close()
    assert stored_ids(capture.store) == [f"r{i}" for i in range(6)]


def test_secrets_are_redacted_before_the_wal_and_token_ids_kept(tmp_path):
    capture = TraceCapture(settings(tmp_path))
    capture.start()
    secret = "sk-live-0123456789abcdefABCDEF"
    rec = make_record("r1", prompt=[5, 6, 7], completion=[8],
                      messages=[{"role": "user", "content": f"my key is {secret}"}])
    capture.record_sync(rec)
    wal_bytes = b"".join(path.read_bytes() for path in capture.store.wal_dir.glob("*.wal"))
    assert secret.encode() not in wal_bytes
    assert b"[REDACTED:api_key]" in wal_bytes
    [stored] = [codec.decode_trace(p) for path in capture.store.wal_dir.glob("*.wal")
                for p in read_frames(path)]
    assert stored.prompt_token_ids == [5, 6, 7] and stored.completion_token_ids == [8]
    capture.close()


def test_start_recovers_what_a_previous_writer_left(tmp_path):
    store = TraceStore(tmp_path / "store")
    segment = store.new_segment()
    segment.append([codec.encode(make_record("orphan"))])
    segment.close()
    capture = TraceCapture(settings(tmp_path))
    capture.start()
    assert capture.stats["recovered"] == 1
    capture.close()
    assert stored_ids(capture.store) == ["orphan"]


def test_a_caller_that_stops_waiting_still_gets_its_record_stored(tmp_path):
    gated = GatedRedactorDouble()
    capture = TraceCapture(settings(tmp_path), redactor=gated)
    capture.start()

    async def scenario():
        first = asyncio.create_task(capture.record(make_record("first")))   # holds the writer
        await asyncio.sleep(0.1)
        waiting = asyncio.create_task(capture.record(make_record("cancelled")))   # still queued
        await asyncio.sleep(0.1)
        waiting.cancel()            # e.g. the client disconnected
        gated.gate.set()
        await first
        await capture.record(make_record("after"))   # the writer is still alive

    asyncio.run(scenario())
    capture.close()
    assert stored_ids(capture.store) == ["after", "cancelled", "first"]
    assert capture.stats["write_errors"] == 0
