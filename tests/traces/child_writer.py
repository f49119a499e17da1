"""Child process of test_crash.py: writes traces fast and prints each acknowledged id.

Usage: child_writer.py STORE_DIR [SEALED_URI S3_ENDPOINT_URL]. A line "ack <request_id>" is printed only after
`await capture.record()` returned, i.e. after the record was fsync'ed in the WAL. With an s3:// SEALED_URI the
credentials come from the standard AWS variables.
"""
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from trace_factory import make_record  # noqa: E402

from trace_pipeline.capture import TraceCapture  # noqa: E402
from trace_pipeline.settings import S3Settings, TraceSettings  # noqa: E402

PRODUCERS = 16


async def produce(capture: TraceCapture, worker: int) -> None:
    prompt = list(range(1000, 1512))
    for i in range(10**9):
        rid = f"w{worker}-{i}"
        await capture.record(make_record(rid, session_id=f"s{worker}", prompt=prompt,
                                         completion=list(range(64))))
        sys.stdout.write(f"ack {rid}\n")
        sys.stdout.flush()


async def main(store_dir: str, sealed_uri: str | None = None, endpoint_url: str | None = None) -> None:
    # Small seal thresholds so the kill also lands mid-seal, not only mid-WAL-append.
    capture = TraceCapture(TraceSettings(dir=Path(store_dir), flush_every_records=300,
                                         flush_every_s=0.2, queue_size=64, sealed_uri=sealed_uri,
                                         s3=S3Settings(endpoint_url=endpoint_url)))
    capture.start()
    print("ready", flush=True)
    await asyncio.gather(*(produce(capture, w) for w in range(PRODUCERS)))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
