"""A throwaway S3-compatible server for tests and benchmarks: a real one, moto's (`moto[server]`, the dev extra),
in a process of its own on a free loopback port.

    with S3Server.running() as server:
        server.create_bucket("traces")
        settings = TraceSettings(sealed_uri="s3://traces/run-1", s3=server.settings())

It speaks the S3 REST API over HTTP like AWS, MinIO or Ceph; clients reach it with any credentials (the server
checks none). Its objects live in its memory and are gone when the `running()` block stops it. `running(port)`
takes a port, e.g. to bring a server up where a client already points (the store's retry tests).
"""
from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import BinaryIO

import pyarrow.fs as pafs

from trace_pipeline.sealed import s3_filesystem
from trace_pipeline.settings import S3Settings

HOST = "127.0.0.1"
START_TIMEOUT_S = 30
ACCESS_KEY_ID = "rollout-serve-test"
SECRET_ACCESS_KEY = "rollout-serve-test-secret"
REGION = "us-east-1"


class S3ServerUnavailable(RuntimeError):
    """moto's server is not installed, or would not start (the message says which)."""


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's pick, on loopback)."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


class S3Server:
    """A running server (module docstring); `running()` starts it and stops it."""

    def __init__(self, port: int, process: subprocess.Popen, log: BinaryIO):
        self.port = port
        self.process = process
        self.log = log   # its stderr: a line per request; a file, so that a full pipe never blocks it

    @classmethod
    @contextlib.contextmanager
    def running(cls, port: int | None = None) -> Iterator[S3Server]:
        port = port or free_port()
        command = [sys.executable, "-m", "moto.server", "--host", HOST, "--port", str(port)]
        with tempfile.TemporaryFile() as log:
            try:
                process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
            except OSError as exc:
                raise S3ServerUnavailable(f"could not run {' '.join(command)}: {exc}") from exc
            server = cls(port, process, log)
            try:
                server._wait_until_listening()
                yield server
            finally:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()

    @property
    def endpoint_url(self) -> str:
        return self.settings().endpoint_url

    def settings(self) -> S3Settings:
        """How a trace store reaches this server (TraceSettings.s3)."""
        return self.settings_for(self.port)

    @staticmethod
    def settings_for(port: int) -> S3Settings:
        """How a trace store reaches a server on this port, running or not (yet)."""
        return S3Settings(endpoint_url=f"http://{HOST}:{port}", region=REGION, access_key_id=ACCESS_KEY_ID,
                          secret_access_key=SECRET_ACCESS_KEY)

    def environment(self) -> dict[str, str]:
        """The same as the standard AWS variables, for a process that reads its credentials from them."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
                "AWS_DEFAULT_REGION": REGION}

    def filesystem(self) -> pafs.S3FileSystem:
        """A client of this server of its own (pyarrow's), e.g. to list what a store wrote."""
        return s3_filesystem(self.settings())

    def create_bucket(self, name: str) -> None:
        client = pafs.S3FileSystem(endpoint_override=f"{HOST}:{self.port}", scheme="http", region=REGION,
                                   access_key=ACCESS_KEY_ID, secret_key=SECRET_ACCESS_KEY,
                                   allow_bucket_creation=True)   # the stores' own clients may not
        client.create_dir(name)   # a directory at the top level of S3's namespace is a bucket

    def _wait_until_listening(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.seek(0)
                raise S3ServerUnavailable(f"moto's S3 server exited ({self.process.returncode}): "
                                          f"{self.log.read().decode(errors='replace')[-2000:]} "
                                          "(install the dev extra: pip install -e '.[dev]')")
            with contextlib.suppress(OSError), socket.create_connection((HOST, self.port), timeout=0.5):
                return
            time.sleep(0.05)
        raise S3ServerUnavailable(f"moto's S3 server did not listen on {HOST}:{self.port} in {START_TIMEOUT_S} s")
