"""The cluster mode's control plane for tests (rollout_server/harness/cluster.py): real etcd and NATS servers."""

import socket

import httpx

from rollout_server.harness.cluster import ControlPlane


def test_etcd_and_nats_run_on_loopback_and_are_gone_after():
    with ControlPlane.running() as plane:
        put = httpx.post(f"{plane.etcd_url}/v3/kv/put", json={"key": "a2V5", "value": "dmFsdWU="}, timeout=5)
        assert put.status_code == 200
        got = httpx.post(f"{plane.etcd_url}/v3/kv/range", json={"key": "a2V5"}, timeout=5).json()
        assert got["kvs"][0]["value"] == "dmFsdWU="  # base64 of "value"
        with socket.create_connection(("127.0.0.1", plane.nats_port), timeout=5) as conn:
            assert conn.recv(5) == b"INFO "
        processes, root = plane.processes, plane.root
    assert all(p.poll() is not None for p in processes)
    assert not root.exists()
