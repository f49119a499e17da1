"""The policy (weight) version a worker's KV belongs to: the hook a live weight update bumps.

Each worker's connector reads its version from a small file (one per worker, so a rolling
update can move workers one at a time). `rollout-serve up` writes the configured
`policy_version` there at start; a live weight update must call `write_policy_version` for the
worker after its new weights are loaded and before it serves again (pause -> load weights ->
write version -> resume). KV computed under one version is never looked up under another.
"""

from __future__ import annotations

import os
from pathlib import Path

from engine.ids import PolicyVersion


def write_policy_version(path: Path, version: PolicyVersion) -> None:
    """Atomically replaces the version in `path` (readers never see a partial write)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{int(version)}\n")
    os.replace(tmp, path)


class VersionFile:
    """The version in a file, re-read only when the file changes; `default` while it is absent."""

    def __init__(self, path: Path | None, default: PolicyVersion):
        self.path = path
        self.default = default
        self._stamp: tuple[int, int] | None = None
        self._version = default

    def current(self) -> PolicyVersion:
        if self.path is None:
            return self.default
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return self.default
        stamp = (stat.st_mtime_ns, stat.st_ino)
        if stamp != self._stamp:
            self._version = PolicyVersion(int(self.path.read_text().strip()))
            self._stamp = stamp
        return self._version
