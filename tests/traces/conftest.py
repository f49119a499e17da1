"""Where the trace tests' stores seal: on the local disk, or in a real S3-compatible server (moto's, started once
per test session on a free loopback port: rollout_server/harness/s3_server.py)."""
import uuid

import pytest

from rollout_server.harness.s3_server import S3Server

BUCKET = "traces"


@pytest.fixture(scope="session")
def s3_server():
    with S3Server.running() as server:
        server.create_bucket(BUCKET)
        yield server


def sealed_in(where: str, request: pytest.FixtureRequest) -> dict:
    """Keyword arguments of TraceStore and TraceSettings that put sealed files there: nothing for "local" (under
    the store's directory), a fresh prefix of the bucket for "s3"."""
    if where == "local":
        return {}
    server = request.getfixturevalue("s3_server")
    return {"sealed_uri": f"s3://{BUCKET}/{uuid.uuid4().hex}", "s3": server.settings()}


@pytest.fixture(params=["local", "s3"])
def sealed(request) -> dict:
    """A test that takes this runs twice: its store seals locally, then to S3 (sealed_in)."""
    return sealed_in(request.param, request)
