"""Cluster mode's settings and its KV-event broker on fixed ports (fast: no stack)."""

import pytest
import zmq

from engine.settings import EngineSettings
from engine.supervisor.event_broker import EventBroker, broker_url
from engine.supervisor.stack import dynamo_env
from rollout_server.harness.stack import free_port_block


def test_cluster_mode_is_etcd_discovery_and_the_single_host_default_is_unchanged(tmp_path):
    single = dynamo_env(EngineSettings(), tmp_path, "xsub=tcp://127.0.0.1:1 , xpub=tcp://127.0.0.1:2")
    assert single["DYN_DISCOVERY_BACKEND"] == "file" and single["DYN_FILE_KV"] == str(tmp_path)
    assert "ETCD_ENDPOINTS" not in single
    cluster = EngineSettings(cluster=True, etcd_endpoints="http://10.0.0.1:2379")
    env = dynamo_env(cluster, tmp_path, "unused")
    assert env["DYN_DISCOVERY_BACKEND"] == "etcd" and env["ETCD_ENDPOINTS"] == "http://10.0.0.1:2379"
    assert "DYN_FILE_KV" not in env and env["DYN_REQUEST_PLANE"] == "tcp"
    assert "ETCD_ENDPOINTS" not in dynamo_env(EngineSettings(cluster=True), tmp_path, "unused")  # the environment's


def test_cluster_mode_refuses_pools_of_their_own_discovery_directories(tmp_path):
    with pytest.raises(ValueError, match="pools_file needs discovery_backend file"):
        EngineSettings(cluster=True, pools={"pools_file": tmp_path / "pools.toml"})


def test_a_fixed_port_broker_forwards_what_a_publisher_sends_and_names_a_taken_port():
    port = free_port_block(2, start=28900)
    broker = EventBroker("127.0.0.1", port)
    context = zmq.Context()
    try:
        assert broker.url == broker_url("127.0.0.1", port) == f"xsub=tcp://127.0.0.1:{port} , xpub=tcp://127.0.0.1:{port + 1}"
        subscriber, publisher = context.socket(zmq.SUB), context.socket(zmq.PUB)
        subscriber.connect(f"tcp://127.0.0.1:{port + 1}")
        subscriber.setsockopt(zmq.SUBSCRIBE, b"")
        subscriber.setsockopt(zmq.RCVTIMEO, 200)
        publisher.connect(f"tcp://127.0.0.1:{port}")
        for _ in range(50):  # until the subscription has crossed the broker
            publisher.send(b"kv event")
            try:
                assert subscriber.recv() == b"kv event"
                break
            except zmq.Again:
                continue
        else:
            raise AssertionError("nothing crossed the broker")
        with pytest.raises(RuntimeError, match="choose another --event-broker-port"):
            EventBroker("127.0.0.1", port)
    finally:
        context.destroy(linger=0)
        broker.stop()


def test_broker_urls_of_names_and_ipv6_addresses():
    assert broker_url("front.internal", 20500) == "xsub=tcp://front.internal:20500 , xpub=tcp://front.internal:20501"
    assert broker_url("fd00::1", 20500) == "xsub=tcp://[fd00::1]:20500 , xpub=tcp://[fd00::1]:20501"
