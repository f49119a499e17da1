"""Child processes that die with their parent.

Each child gets its own process group (so stopping it also stops what it spawned,
e.g. vLLM's engine-core process) and a parent-death signal (so a SIGKILLed
`rollout-serve up` leaves no orphans behind).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


@dataclass
class ProcessSpec:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ChildProcess:
    def __init__(self, spec: ProcessSpec):
        self.spec = spec
        self.popen: subprocess.Popen | None = None

    def start(self) -> None:
        out = open(self.spec.log_path, "ab") if self.spec.log_path else subprocess.DEVNULL
        env = {**os.environ, **self.spec.env}
        self.popen = subprocess.Popen(
            self.spec.argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=_die_with_parent,
        )
        log.info("started %s (pid %d), log: %s", self.spec.name, self.popen.pid, self.spec.log_path)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def exit_code(self) -> int | None:
        return self.popen.poll() if self.popen else None

    def log_tail(self, lines: int = 20) -> str:
        if not self.spec.log_path or not self.spec.log_path.exists():
            return ""
        return "\n".join(self.spec.log_path.read_text(errors="replace").splitlines()[-lines:])

    def signal_group(self, sig: int) -> None:
        if self.popen is None:
            return
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass


def stop_all(children: list[ChildProcess], grace_s: float = 15.0) -> None:
    """SIGTERM every group, wait up to `grace_s`, then SIGKILL what is left."""
    for child in children:
        child.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        if child.popen is None:
            continue
        try:
            child.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0fs: killing it", child.spec.name, grace_s)
        # Kill the whole group even when the leader exited: vLLM's engine core may linger.
        child.signal_group(signal.SIGKILL)
        try:
            child.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.error("%s (pid %d) survived SIGKILL", child.spec.name, child.popen.pid)
