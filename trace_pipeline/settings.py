"""Settings of the trace pipeline; the settings tree (rollout_server/settings.py) nests them as `traces`."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator


class S3Settings(BaseModel):
    """How to reach the object store of an `s3://` sealed_uri. What is left unset comes from the standard AWS
    chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_DEFAULT_REGION, ~/.aws)."""

    endpoint_url: str | None = Field(
        None, description="an S3-compatible server instead of AWS, e.g. http://127.0.0.1:9000 (MinIO, Ceph, moto); "
                          "the scheme (http or https) is the one the store is reached with. None: AWS's endpoint")
    region: str | None = Field(None, description="the bucket's region; None: AWS_DEFAULT_REGION, else us-east-1")
    access_key_id: str | None = Field(None, description="None: the standard AWS chain (AWS_ACCESS_KEY_ID, ...)")
    secret_access_key: SecretStr | None = Field(
        None, description="None: the standard AWS chain; prefer the environment "
                          "(ROLLOUT_SERVE_TRACES__S3__SECRET_ACCESS_KEY, AWS_SECRET_ACCESS_KEY) to a flag, which "
                          "other users of the machine can read in the process list")

    @field_validator("endpoint_url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"endpoint_url must start with http:// or https://, not {url!r}")
        return url


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
    # Where sealed Parquet files go (trace_pipeline/sealed.py). The WAL and the rewards log stay under `dir`:
    # their appends, fsyncs and locks need a local file system.
    sealed_uri: str | None = Field(
        None, description="where sealed Parquet files go: None keeps them under dir (dir/traces); an "
                          "absolute local directory; or s3://bucket/prefix, an S3-compatible object store (see traces.s3)")
    s3: S3Settings = Field(default_factory=S3Settings, description="the object store of an s3:// sealed_uri")
    seal_retry_s: float = Field(
        5.0, gt=0, description="after a failed seal (an unreachable object store, a full disk: the WAL keeps the "
                               "records), seconds until the sealer tries again, with or without new traffic")
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

    @field_validator("sealed_uri")
    @classmethod
    def _local_or_s3(cls, uri: str | None) -> str | None:
        if uri is not None and "://" in uri and not uri.startswith("s3://"):
            raise ValueError(f"sealed_uri must be a local directory or s3://bucket/prefix, not {uri!r}")
        if uri is not None and uri.startswith("s3://") and not uri.removeprefix("s3://").strip("/"):
            raise ValueError("sealed_uri s3:// must name a bucket: s3://bucket/prefix")
        if uri is not None and "://" not in uri and not Path(uri).is_absolute():
            raise ValueError(f"a local sealed_uri must be an absolute directory, not {uri!r}")
        return uri

    @property
    def keeps_logprobs(self) -> bool:
        """Whether every request's sampled-token logprobs are wanted, for its trace."""
        return self.enabled and self.capture_logprobs
