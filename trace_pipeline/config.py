"""Settings of the trace pipeline; the app nests this model in its own settings class."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import pydantic


class TraceSettings(pydantic.BaseModel):
    enabled: bool = True
    dir: Path = Path("traces")  # relative: under the front door's state directory
    # Keep every sampled token's logprob (the behaviour policy's, for RL), also when the client did not ask for
    # logprobs. The engine then computes them for every request: on the tiny CPU model that cost 2-11% of its
    # throughput (docs/benchmarks.md, "Front door"). Off: such requests' traces hold their exact ids, no logprobs.
    capture_logprobs: bool = True
    # Records waiting between the serving side and the writer thread.
    queue_size: int = pydantic.Field(default=8192, ge=1)
    # What record() does when the queue is full: wait for room ("block"), or append
    # the record to an overflow WAL segment on disk ("spill"). Never drops.
    full_policy: Literal["block", "spill"] = "block"
    # "durable": record() returns once the record is fsync'ed in the WAL (group commit).
    # "enqueue": record() returns once the record is in the queue (lost on kill -9 until written).
    ack: Literal["durable", "enqueue"] = "durable"
    redact: bool = True
    # Most records in one WAL write + fsync (one group commit).
    max_batch_records: int = pydantic.Field(default=1024, ge=1)
    # Seal buffered WAL records into Parquet after this many records or seconds.
    flush_every_records: int = pydantic.Field(default=8192, ge=1)
    flush_every_s: float = pydantic.Field(default=10.0, gt=0)
    zstd_level: int = pydantic.Field(default=3, ge=1, le=22)

    @property
    def keeps_logprobs(self) -> bool:
        """Whether every request's sampled-token logprobs are wanted, for its trace."""
        return self.enabled and self.capture_logprobs
