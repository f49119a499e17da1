"""The weights a worker's KV belongs to: the hook every live weight update bumps.

Each worker's connector reads what weights it runs from a small file (one per worker, so a rolling
update can move workers one at a time):

    <policy version of the full weights>
    <adapter name> <adapter version>      one line per LoRA adapter loaded beside them

`rollout-serve up` writes the configured policy version there at start. A live update writes the
worker's file before its new weights serve (full weights: pause -> load -> write version -> resume;
an adapter: write its version -> load it, since loading it again waits for the old one's requests to
drain and holds new ones back until it is loaded). KV computed under one set of weights is never
looked up under another: an adapter deployed again under the same name is another version.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.ids import PolicyVersion


@dataclass(frozen=True)
class Weights:
    """The weights one request runs on: the full weights' version, and its LoRA adapter's (None: no adapter, or
    one loaded without a version)."""

    base: PolicyVersion
    adapter: PolicyVersion | None = None


def write_policy_version(path: Path, version: PolicyVersion) -> None:
    """The worker's full weights are now `version` (its adapters' lines are kept)."""
    _, adapters = _read(path)
    _write(path, version, adapters)


def write_adapter_version(path: Path, name: str, version: PolicyVersion | None) -> None:
    """The worker's adapter `name` is now `version` (None: unloaded)."""
    base, adapters = _read(path)
    adapters.pop(name, None)
    if version is not None:
        adapters[name] = version
    _write(path, base, adapters)


def _read(path: Path) -> tuple[PolicyVersion | None, dict[str, PolicyVersion]]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None, {}
    adapters = {}
    for line in lines[1:]:
        name, _, version = line.rpartition(" ")
        if name:
            adapters[name] = PolicyVersion(int(version))
    return (PolicyVersion(int(lines[0])) if lines else None), adapters


def _write(path: Path, base: PolicyVersion | None, adapters: dict[str, PolicyVersion]) -> None:
    """Atomically (readers never see a partial write)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    lines = [f"{int(base if base is not None else 0)}"] + [f"{name} {int(v)}" for name, v in sorted(adapters.items())]
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)


class VersionFile:
    """The weights in a file, re-read only when the file changes; `default` (no adapters) while it is absent."""

    def __init__(self, path: Path | None, default: PolicyVersion):
        self.path = path
        self.default = default
        self._stamp: tuple[int, int] | None = None
        self._version = default
        self._adapters: dict[str, PolicyVersion] = {}

    def current(self) -> PolicyVersion:
        """The full weights' version."""
        self._refresh()
        return self._version

    def weights_of(self, lora: str) -> Weights:
        """What a request with LoRA adapter `lora` ("" for none) runs on."""
        self._refresh()
        return Weights(self._version, self._adapters.get(lora) if lora else None)

    def _refresh(self) -> None:
        if self.path is None:
            return
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._version, self._adapters, self._stamp = self.default, {}, None
            return
        stamp = (stat.st_mtime_ns, stat.st_ino)
        if stamp != self._stamp:
            base, self._adapters = _read(self.path)
            self._version = self.default if base is None else base
            self._stamp = stamp
