import os

import pytest
import torch

# Kernel tests run Triton's interpreter on CPU. Triton reads TRITON_INTERPRET when it is first
# imported, and other test modules import it early (through vLLM and xgrammar): set it here, first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SLOW_MARKERS = ("stack", "disagg")


@pytest.fixture(scope="session")
def postgres_server():
    """A real PostgreSQL server for the session, on a Unix socket of its own (rollout_server/harness/postgres.py)."""
    from rollout_server.harness.postgres import PostgresServer

    with PostgresServer.running() as server:
        yield server


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request, tmp_path):
    """An empty database for one test, on each backend the state stores run on: a SQLite file, then a fresh
    database of the session's PostgreSQL server (fast tier: no stack; `-m postgres` selects those cases)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    return request.getfixturevalue("postgres_server").new_database()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Tells the stack harness and tests/tiny_models.py which tier this test is in, before its fixtures are set
    up: a test of the fast tier that starts a stack or asks for the trained model fails, naming the marker."""
    from rollout_server.harness.stack import TEST_TIER_ENV

    slow = any(item.get_closest_marker(marker) for marker in SLOW_MARKERS)
    os.environ[TEST_TIER_ENV] = "stack" if slow else "fast"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test on a real stack reports the stack's logs too: CI keeps nothing else."""
    report = yield
    if report.failed:
        for stack in _running_stacks(getattr(item, "funcargs", {}).values()):
            report.sections.append(("rollout-serve logs", stack.diagnostics()))
    return report


def _running_stacks(values) -> list:
    """The RunningStacks among a test's fixture values, and inside a tuple, list or object among them."""
    from rollout_server.harness.stack import RunningStack
    found = []
    for value in values:
        inner = value if isinstance(value, (tuple, list)) else getattr(value, "__dict__", {}).values()
        found += [v for v in [value, *inner] if isinstance(v, RunningStack) and v not in found]
    return found
