"""Test doubles shared by the usage, quota and batch tests."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request
from fastapi.testclient import TestClient

from rollout_server.auth import Principal
from rollout_server.errors import install_error_handlers

ADMIN_TEAM = "admins"


def principal_from_test_header(request: Request) -> Principal:
    """Test double for the app's authentication: the team is the x-test-team header."""
    team = request.headers.get("x-test-team", "team-a")
    return Principal(team=team, key_prefix=f"rs-{team}"[:10], is_admin=team == ADMIN_TEAM)


def as_team(team: str) -> dict[str, str]:
    return {"x-test-team": team}


def client_for(router: APIRouter) -> TestClient:
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(router)
    return TestClient(app)


class ManualClock:
    """Test double for time.monotonic: moves only when the test says so."""

    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
