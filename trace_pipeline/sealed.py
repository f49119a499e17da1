"""Where sealed Parquet files live: a local directory or an S3-compatible object store, behind one pyarrow
FileSystem, so that sealing, listing, reading, exporting and retention run the same code on both.

    settings.sealed_uri                    file system                    root
    None                                   LocalFileSystem                <dir>/traces
    /abs/dir                               LocalFileSystem                /abs/dir
    s3://bucket/prefix                     S3FileSystem (settings.s3)     bucket/prefix

The WAL and the rewards log are not here: they stay on the local disk (trace_pipeline/store.py), because their
appends, fsyncs and locks need a file system. A record is acknowledged once it is in the WAL; its segment is
deleted only after every sealed file of it is written here, so an object store that is down costs no record.

A sealed file appears whole or not at all:
- locally, it is written to a temp name, fsync'ed, renamed into place, its directory fsync'ed
  (tables.write_parquet_atomically);
- on S3, it is built in memory and only then uploaded to its final key. S3 makes an object visible when its
  upload completes (a PUT, or the completion of a multipart upload), never a part of one, and replaces an
  object the same way; a writer that dies mid-upload leaves no object.
"""
from __future__ import annotations

from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from trace_pipeline.settings import S3Settings
from trace_pipeline.tables import PARQUET_OPTIONS, make_dirs_durably, write_parquet_atomically
from trace_pipeline.wal import PRIVATE_DIR

SUFFIX = ".parquet"


class SealedFiles:
    """The sealed Parquet files of one store: their file system and the root path of the files in it."""

    def __init__(self, filesystem: pafs.FileSystem, root: str, uri: str):
        self.fs = filesystem
        self.root = root.rstrip("/")
        self.uri = uri   # for messages: where the files are, as the settings named it
        self.is_local = isinstance(filesystem, pafs.LocalFileSystem)

    @classmethod
    def open(cls, uri: str | Path, s3: S3Settings | None = None) -> SealedFiles:
        """A local directory (made, private) or s3://bucket/prefix (reached as `s3` says)."""
        uri = str(uri)
        if uri.startswith("s3://"):
            return cls(s3_filesystem(s3 or S3Settings()), uri.removeprefix("s3://"), uri)
        directory = Path(uri).absolute()
        make_dirs_durably(directory)
        directory.chmod(PRIVATE_DIR)   # also a store made before files were private
        return cls(pafs.LocalFileSystem(), str(directory), uri)

    # ---- names -------------------------------------------------------------------------

    def path_of(self, partition: str, name: str) -> str:
        """The path, in self.fs, of a file of one partition (store.partition_path)."""
        return f"{self.root}/{partition}/{name}"

    def relative(self, path: str) -> str:
        """The path under the root: date=.../model=.../policy_version=.../<segment>.parquet."""
        return path.removeprefix(self.root + "/")

    # ---- reading -----------------------------------------------------------------------

    def list(self) -> list[pafs.FileInfo]:
        """Every sealed file (path and size), in path order. Temp files (".name...tmp") are not listed."""
        selector = pafs.FileSelector(self.root, recursive=True, allow_not_found=True)
        files = [info for info in self.fs.get_file_info(selector)
                 if info.type == pafs.FileType.File and info.base_name.endswith(SUFFIX)
                 and not info.base_name.startswith(".")]
        return sorted(files, key=lambda info: info.path)

    def read(self, path: str, columns: list[str] | None = None) -> pa.Table:
        return pq.read_table(path, columns=columns, filesystem=self.fs)

    def dataset(self, paths: list[str], schema: pa.Schema) -> ds.Dataset:
        return ds.dataset(paths, schema=schema, format="parquet", filesystem=self.fs)

    # ---- writing -----------------------------------------------------------------------

    def write(self, table: pa.Table, path: str, zstd_level: int) -> None:
        """Writes (or replaces) one sealed file; readers see the old file or the whole new one (module doc)."""
        if self.is_local:
            write_parquet_atomically(table, Path(path), zstd_level)
            return
        buffer = pa.BufferOutputStream()
        pq.write_table(table, buffer, compression_level=zstd_level, **PARQUET_OPTIONS)
        data = buffer.getvalue()
        with self.fs.open_output_stream(path) as stream:   # the object appears when this closes
            stream.write(data)

    def delete(self, path: str) -> None:
        try:
            self.fs.delete_file(path)
        except FileNotFoundError:
            pass


def s3_filesystem(s3: S3Settings) -> pafs.S3FileSystem:
    """pyarrow's S3 client for these settings; what they leave unset comes from the standard AWS chain."""
    options: dict = {}
    if s3.endpoint_url is not None:
        endpoint = urlsplit(s3.endpoint_url)
        options.update(endpoint_override=endpoint.netloc + endpoint.path.rstrip("/"), scheme=endpoint.scheme)
    if s3.region is not None:
        options["region"] = s3.region
    if s3.access_key_id is not None and s3.secret_access_key is not None:
        options.update(access_key=s3.access_key_id, secret_key=s3.secret_access_key.get_secret_value())
    return pafs.S3FileSystem(**options)


def stem(path: str) -> str:
    """The file's name without .parquet: the name of the WAL segment it was sealed from."""
    return PurePosixPath(path).stem
