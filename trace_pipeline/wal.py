"""Write-ahead log segments: length + CRC framed payloads, appended and fsync'ed.

A segment is one file written by one process. While open it holds an exclusive
flock, so recovery in another process never steals a live writer's segment; the
kernel drops the lock when the writer dies (kill -9 included).

Segments are created 0600 (PRIVATE_FILE): they hold every team's prompts.

Frame: <u32 payload length><u32 crc32(payload)><payload>. A reader stops at the first
short or corrupt frame: that is the torn tail of a write that was never acknowledged.
"""
from __future__ import annotations

import fcntl
import logging
import os
import struct
import zlib
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)

FRAME_HEADER = struct.Struct("<II")
SUFFIX = ".wal"
# Trace files hold every team's prompts and outputs: only the server's user may read them.
PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def encode_frames(payloads: list[bytes]) -> bytes:
    parts = []
    for payload in payloads:
        parts.append(FRAME_HEADER.pack(len(payload), zlib.crc32(payload)))
        parts.append(payload)
    return b"".join(parts)


class WalSegment:
    """An open, locked segment file that only this object appends to."""

    def __init__(self, path: Path):
        self.path = path
        self.records = 0
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fsync_dir(path.parent)   # the new directory entry must survive a crash too

    def append(self, payloads: list[bytes]) -> None:
        """Writes the frames and fsyncs: on return they survive kill -9 and power loss."""
        data = memoryview(encode_frames(payloads))
        while data:
            written = os.write(self._fd, data)
            data = data[written:]
        os.fsync(self._fd)
        self.records += len(payloads)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)   # also releases the flock
            self._fd = -1


def write_segment_atomically(path: Path, payloads: list[bytes]) -> None:
    """Replaces a closed segment with one holding `payloads`: a temp file (0600), fsync'ed, renamed into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    try:
        data = memoryview(encode_frames(payloads))
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_frames(path: Path) -> Iterator[bytes]:
    """Yields the payloads of every complete, intact frame, in write order."""
    data = path.read_bytes()
    offset = 0
    while offset + FRAME_HEADER.size <= len(data):
        length, crc = FRAME_HEADER.unpack_from(data, offset)
        start = offset + FRAME_HEADER.size
        payload = data[start:start + length]
        if len(payload) < length or zlib.crc32(payload) != crc:
            break
        yield payload
        offset = start + length
    if offset != len(data):
        log.warning("WAL %s: ignored %d bytes of torn tail at offset %d (never acknowledged)",
                    path, len(data) - offset, offset)
