"""engine/supervisor/event_broker.py: the broker's URL names the ports it listens on, and events pass through it."""

import time

import zmq

from engine.supervisor.event_broker import EventBroker


def test_a_brokers_url_names_the_ports_it_bound_and_events_pass():
    broker = EventBroker("127.0.0.1")  # two random ports: not always adjacent
    try:
        bound = [s.getsockopt(zmq.LAST_ENDPOINT).decode() for s in (broker._publishers, broker._subscribers)]
        assert broker.url == f"xsub={bound[0]} , xpub={bound[1]}"
        xsub, xpub = (part.split("=", 1)[1] for part in broker.url.split(" , "))
        context = zmq.Context()
        publisher, subscriber = context.socket(zmq.PUB), context.socket(zmq.SUB)
        publisher.connect(xsub)
        subscriber.connect(xpub)
        subscriber.setsockopt(zmq.SUBSCRIBE, b"")
        deadline = time.monotonic() + 5
        while not subscriber.poll(50):  # a subscription takes a moment to reach the publisher (ZMQ's slow joiner)
            assert time.monotonic() < deadline, "no event came through the broker"
            publisher.send(b"kv-event")
        assert subscriber.recv() == b"kv-event"
        context.destroy(linger=0)
    finally:
        broker.stop()
