"""Settings of the trace pipeline; the settings tree (rollout_server/settings.py) nests them as `traces`."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field


class TraceSettings(BaseModel):
    enabled: bool = Field(True, description="capture a trace record per choice of every request")
    dir: Path = Field(Path("traces"), description="the trace store (relative: under the front door's state directory)")
    capture_logprobs: bool = Field(
        True, description="keep every sampled token's logprob (the behaviour policy's, for RL), also when the client "
                          "did not ask for logprobs; the engine then computes them for every request, at a cost in "
                          "throughput (docs/benchmarks.md, \"Measurements behind design choices\"). Off: such "
                          "requests' traces hold their exact ids, no logprobs")
    queue_size: int = Field(8192, ge=1, description="records waiting between the serving side and the writer thread")
    full_policy: Literal["block", "spill"] = Field(
        "block", description="what record() does when the queue is full: wait for room (block), or append the "
                             "record to an overflow WAL segment on disk (spill). Never drops")
    ack: Literal["durable", "enqueue"] = Field(
        "durable", description="durable: record() returns once the record is fsync'ed in the WAL (group commit); "
                               "enqueue: once it is in the queue (lost on kill -9 until written)")
    redact: bool = Field(True, description="remove common secret shapes from text fields before writing")
    max_batch_records: int = Field(1024, ge=1, description="most records in one WAL write + fsync (one group commit)")
    flush_every_records: int = Field(8192, ge=1, description="seal buffered WAL records into Parquet after this many")
    flush_every_s: float = Field(10.0, gt=0, description="... or after this many seconds")
    zstd_level: int = Field(3, ge=1, le=22, description="Parquet zstd compression level")
    # Retention (trace_pipeline/retention.py): on by default, generously, so that no team can fill the disk and
    # nothing is kept forever by accident, while weeks of heavy RL traffic stay exportable.
    retention_days: float | None = Field(
        90.0, gt=0, description="days a trace record or reward row is kept (by its created_at), then removed by the "
                                "retention sweep; None keeps them forever. 90: a training run's whole history")
    retention_bytes_per_team: int | None = Field(
        20 * 2**30, gt=0, description="bytes of Parquet traces one team may hold (its rows' share of each file), and "
                                      "separately of reward rows; over it the sweep removes that team's oldest "
                                      "records (one sealed file's worth at a time) and no other team's. None: no "
                                      "cap. 20 GiB: about a million 2k-token records, far from a shared disk's size")
    retention_sweep_s: float = Field(3600.0, gt=0, description="seconds between retention sweeps (the first runs "
                                                               "at start); hourly keeps the overshoot small")

    @property
    def keeps_logprobs(self) -> bool:
        """Whether every request's sampled-token logprobs are wanted, for its trace."""
        return self.enabled and self.capture_logprobs
