"""One deployment's KV-event broker: Dynamo's event plane in broker mode, bound to `engine.internal_host`.

Dynamo's ZMQ event plane has two shapes. In direct mode (its default) every publisher (each worker's KV events,
load metrics and active sequences, the frontend's session affinity) binds a PUB socket on every interface
(`tcp://0.0.0.0:0`, hard-coded in Dynamo 1.6.1; `DYN_EVENT_PLANE_HOST` only names the address it advertises),
so anyone who reaches the host could read the token ids of cached prompt blocks or inject events. In broker
mode (`DYN_ZMQ_BROKER_URL`) publishers connect to a broker's XSUB socket and subscribers to its XPUB socket:
the broker is then the plane's only listener, and it binds where we say.

    worker i / frontend --PUB connect--> XSUB [broker] XPUB <--SUB connect-- KV routers (front door, frontend)

Each deployment has a broker of its own, as it has a discovery directory of its own: every deployment's
workers publish under the same Dynamo namespace, so a shared broker would mix their events. The broker is a
thread of the supervisor's process (ZMQ's proxy runs without the GIL); its ports are picked by the system at
start, and the deployment's processes learn them from their environment.
"""

from __future__ import annotations

import ipaddress
import logging
import threading

import zmq

log = logging.getLogger(__name__)


def broker_url(host: str, port: int, subscribers_port: int | None = None) -> str:
    """`DYN_ZMQ_BROKER_URL` of a broker on `host` (an address or a DNS name) whose publishers' port is `port` and
    subscribers' `subscribers_port` (default: the next one, as a cluster's broker binds them)."""
    bracketed = f"[{host}]" if ":" in host else host  # an IPv6 address
    return f"xsub=tcp://{bracketed}:{port} , xpub=tcp://{bracketed}:{subscribers_port or port + 1}"


class EventBroker:
    """An XSUB/XPUB proxy on `host`; `url` is the value of `DYN_ZMQ_BROKER_URL` for the deployment's processes."""

    def __init__(self, host: str, port: int | None = None):
        """`port`: publishers connect to it, subscribers to the next one (a cluster's workers name them from
        other hosts); None: the system picks both."""
        self._context = zmq.Context()
        self._publishers = self._context.socket(zmq.XSUB)   # publishers connect here
        self._subscribers = self._context.socket(zmq.XPUB)  # subscribers connect here
        ipv6 = ipaddress.ip_address(host).version == 6
        for socket in (self._publishers, self._subscribers):
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.IPV6, ipv6)
        bracketed = f"[{host}]" if ipv6 else host
        if port is None:
            xsub_port = self._publishers.bind_to_random_port(f"tcp://{bracketed}")
            xpub_port = self._subscribers.bind_to_random_port(f"tcp://{bracketed}")
        else:
            xsub_port, xpub_port = port, port + 1
            try:
                self._publishers.bind(f"tcp://{bracketed}:{xsub_port}")
                self._subscribers.bind(f"tcp://{bracketed}:{xpub_port}")
            except zmq.ZMQError as exc:
                self._context.destroy()
                raise RuntimeError(f"the KV-event broker cannot listen on {bracketed}:{port} and :{port + 1} "
                                   f"({exc}): choose another --event-broker-port") from exc
        self.url = broker_url(host, xsub_port, xpub_port)  # two random ports need not be adjacent
        self._thread = threading.Thread(target=self._forward, name="kv-event-broker", daemon=True)
        self._thread.start()
        log.info("KV-event broker: %s", self.url)

    def _forward(self) -> None:
        try:
            zmq.proxy(self._publishers, self._subscribers)
        except zmq.ContextTerminated:
            pass  # stop(): the context is being terminated
        finally:
            self._publishers.close()
            self._subscribers.close()

    def stop(self) -> None:
        """Ends the proxy (it sees the context end and closes both sockets) and waits for its thread."""
        self._context.term()
        self._thread.join(timeout=5.0)
