"""The stored Parquet schema and the conversion of records into it.

Free-form JSON (messages, tools, sampling params) is kept as JSON strings: its shape
varies per request, and HF datasets cannot load Arrow map<> columns.
"""
from __future__ import annotations

import os
import uuid
from itertools import chain
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trace_pipeline.records import TraceRecord
from trace_pipeline.wal import PRIVATE_DIR, PRIVATE_FILE, fsync_dir

TRACE_SCHEMA = pa.schema([
    ("request_id", pa.string()),
    ("choice_index", pa.int32()),
    ("session_id", pa.string()),
    ("team", pa.string()),
    ("model", pa.string()),
    ("policy_version", pa.int64()),
    ("endpoint", pa.string()),
    ("created_at", pa.float64()),
    ("request_messages", pa.string()),       # JSON
    ("tools", pa.string()),                  # JSON
    ("prompt_text", pa.string()),
    ("output_message", pa.string()),         # JSON
    ("output_text", pa.string()),
    ("sampling_params", pa.string()),        # JSON
    ("prompt_token_ids", pa.list_(pa.int64())),
    ("completion_token_ids", pa.list_(pa.int64())),
    ("completion_logprobs", pa.list_(pa.float64())),
    ("completion_mask", pa.list_(pa.int8())),  # null = all ones
    ("completion_policy_versions", pa.list_(pa.int64())),  # null = all policy_version
    ("finish_reason", pa.string()),
    ("queue_ms", pa.float64()),
    ("ttft_ms", pa.float64()),
    ("inter_token_ms", pa.list_(pa.float64())),
    ("total_ms", pa.float64()),
    ("cached_tokens", pa.int64()),
    ("worker_ids", pa.list_(pa.string())),
    ("source", pa.string()),
    ("dropped_fields", pa.list_(pa.string())),  # null = none; else fields dropped as unredactable/unencodable
])

JSON_COLUMNS = ("request_messages", "tools", "output_message", "sampling_params")
_json = msgspec.json.Encoder()


def to_json(value) -> str | None:
    return None if value is None else _json.encode(value).decode()


# Non-null number lists, converted through numpy: faster than through nested Python lists.
NUMBER_LISTS = {"prompt_token_ids": np.int64, "completion_token_ids": np.int64,
                "completion_logprobs": np.float64, "inter_token_ms": np.float64}
STRING_COLUMNS = [f.name for f in TRACE_SCHEMA if pa.types.is_string(f.type)]
CHUNK_RECORDS = 1024   # keeps each list column's int32 offsets far from overflowing
# How every sealed file is written (plus the compression level). Dictionary encoding only pays off for strings;
# trying it on token ids costs time.
PARQUET_OPTIONS = {"compression": "zstd", "row_group_size": 4096, "use_dictionary": STRING_COLUMNS}


def records_to_table(records: list[TraceRecord]) -> pa.Table:
    chunks = [_chunk_to_table(records[i:i + CHUNK_RECORDS])
              for i in range(0, len(records), CHUNK_RECORDS)]
    return pa.concat_tables(chunks) if chunks else TRACE_SCHEMA.empty_table()


def _chunk_to_table(records: list[TraceRecord]) -> pa.Table:
    columns = {}
    for field in TRACE_SCHEMA:
        values = [getattr(r, field.name) for r in records]
        if field.name in JSON_COLUMNS:
            columns[field.name] = pa.array([to_json(v) for v in values], pa.string())
        elif field.name in NUMBER_LISTS:
            columns[field.name] = number_lists(values, field.type, NUMBER_LISTS[field.name])
        else:
            columns[field.name] = pa.array(values, field.type)
    return pa.Table.from_pydict(columns, schema=TRACE_SCHEMA)


def number_lists(lists: list[list], list_type: pa.ListType, dtype) -> pa.ListArray:
    offsets = np.zeros(len(lists) + 1, dtype=np.int32)
    np.cumsum([len(x) for x in lists], out=offsets[1:])
    values = np.fromiter(chain.from_iterable(lists), dtype=dtype, count=int(offsets[-1]))
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, list_type.value_type))


def make_dirs_durably(directory: Path) -> None:
    """mkdir -p, private (0700), that also fsyncs each parent whose entries it changed."""
    if directory.is_dir():
        return
    make_dirs_durably(directory.parent)
    directory.mkdir(mode=PRIVATE_DIR, exist_ok=True)
    fsync_dir(directory.parent)


def write_parquet_atomically(table: pa.Table, path: Path, zstd_level: int) -> None:
    """Writes a temp file, fsyncs it, renames it into place, fsyncs the directory.

    Readers see either no file or the whole file. Rewriting the same path with the
    same rows (recovery after a crash between rename and WAL deletion) is harmless.
    """
    make_dirs_durably(path.parent)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    pq.write_table(table, tmp, compression_level=zstd_level, **PARQUET_OPTIONS)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fchmod(fd, PRIVATE_FILE)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
