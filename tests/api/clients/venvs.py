"""Where the clients users bring are installed: venvs of their own, made by scripts/bootstrap.

verifiers, schemathesis and aiperf pin dependencies that conflict with vLLM's and with each other's
(aiperf pins pyzmq 26, verifiers needs 27), so each runs from its own venv, as a user runs it.
"""

from __future__ import annotations

from pathlib import Path

from rollout_server.harness.stack import REPO

CLIENTS_VENV = REPO / ".venv-clients"   # verifiers (with its renderers), schemathesis, uv
AIPERF_VENV = REPO / ".venv-aiperf"


def client_command(venv: Path, name: str) -> Path:
    """A client's executable; a clear failure when scripts/bootstrap has not installed it."""
    path = venv / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: scripts/bootstrap installs the clients' venvs")
    return path
