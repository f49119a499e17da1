"""No silent open door: open mode is a setting, off by default; it serves callers on loopback only and refuses to
start on another host; admin routes need an admin key except from loopback in open mode, and are logged with
their caller; revoking every key never opens the service, also after a restart."""

import logging
import subprocess
import sys

import pytest

from rollout_server.auth import is_loopback
from rollout_server.harness.stack import REPO, free_port_block
from tests.security.front_door import call, front_door

# (method, path, body) of routes that need admin rights: a deploy control, the deploy listing, every team's usage
ADMIN_CALLS = [("POST", "/pause", {}), ("GET", "/v1/admin/deployments", None), ("GET", "/v1/usage", None)]


def test_open_mode_refuses_to_start_on_a_host_other_than_loopback(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rollout_server.cli", "up", "--open-mode", "--host", "0.0.0.0",
                           "--port", str(free_port_block(1)), "--cache-dir", str(tmp_path), "--state-dir",
                           str(tmp_path / "state")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "--open-mode" in done.stderr and "--host 0.0.0.0" in done.stderr and "loopback" in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []  # refused before anything started: no model, no state


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("::ffff:127.0.0.1", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("::ffff:10.0.0.5", False), ("example.com", False),
    ("testclient", False), (None, False),
])
def test_what_counts_as_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_in_open_mode_a_caller_off_loopback_needs_a_key_and_admin_calls_an_admin_key_else_403(tmp_path, caplog):
    app, keys, _ = front_door(tmp_path, open_mode=True)
    for method, path, body in ADMIN_CALLS:
        refused = call(app, method, path, client="10.0.0.5", json=body)
        assert refused.status_code == 401, (path, refused.text)
        assert "loopback" in refused.json()["error"]["message"]

    with caplog.at_level(logging.INFO, logger="rollout_server.routes.admin"):
        assert call(app, "GET", "/v1/admin/deployments").status_code == 200  # loopback: the local admin
    assert ("admin action: GET /v1/admin/deployments by team=local key=none (open mode) client=127.0.0.1"
            in caplog.text)

    admin, member = keys.create("ops", is_admin=True), keys.create("team-a")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rollout_server.routes.admin"):
        assert call(app, "GET", "/v1/admin/deployments", client="10.0.0.5", key=admin).status_code == 200
    assert f"by team=ops key={admin[:10]} client=10.0.0.5" in caplog.text
    for client in ("10.0.0.5", "127.0.0.1"):  # a key is its own team's, in open mode too, and on loopback
        assert call(app, "GET", "/v1/usage", client=client, key=member).json()["team"] == "team-a"
        refused = call(app, "POST", "/pause", client=client, key=member, json={})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_key_required"


def test_revoking_every_key_keeps_the_service_closed_also_after_a_restart(tmp_path):
    app, keys, _ = front_door(tmp_path, open_mode=False)  # keys read again on every request (recheck_s=0)
    key = keys.create("team-a")
    assert call(app, "GET", "/v1/usage", key=key).json()["team"] == "team-a"
    assert keys.revoke(key[:10]) == 1  # the only key

    restarted, _, _ = front_door(tmp_path, open_mode=False)  # a new server over the same database
    for served in (app, restarted):
        for method, path, body in [("GET", "/v1/usage", None), ("POST", "/v1/chat/completions", {"model": "m"}),
                                   *ADMIN_CALLS]:
            refused = call(served, method, path, json=body)  # from loopback, which open mode alone would let in
            assert refused.status_code == 401, (path, refused.text)
            assert "rollout-serve keys create" in refused.json()["error"]["message"]
            assert call(served, method, path, key=key, json=body).status_code == 401
