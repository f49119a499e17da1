"""Hosts on one machine for the cluster tests: network namespaces joined by a bridge, with addresses the test
assigns (root only: `ip netns add`).

    switch namespace:  bridge rsbr0 --- veth --- front-door namespace  (eth0 ADDRESS.1/24, lo)
                                    \\-- veth --- worker namespace 1  (eth0 ADDRESS.2/24, lo)
                                    \\-- veth --- worker namespace 2  (eth0 ADDRESS.3/24, lo) ...

The bridge lives in a namespace of its own, so nothing is added to this machine's own network; deleting the
namespaces deletes every link with them. `inside(host)` moves the calling thread into a host's namespace
for a block: the sockets it opens there (HTTP checks) and the processes it starts there (servers, stacks) are
that host's.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns failed")


@dataclass(frozen=True)
class Host:
    namespace: str
    address: str  # on the bridge


@dataclass(frozen=True)
class Hosts:
    switch: str
    front_door: Host
    workers: tuple[Host, ...]

    @property
    def worker(self) -> Host:
        return self.workers[0]

    @property
    def namespaces(self) -> list[str]:
        return [self.front_door.namespace, *(w.namespace for w in self.workers), self.switch]


@contextlib.contextmanager
def hosts_on_a_bridge(tag: str, worker_hosts: int = 1, subnet: str = "10.203.7") -> Iterator[Hosts]:
    """A front-door host (`subnet`.1) and `worker_hosts` worker hosts (`subnet`.2, .3, ...) on a bridge; all
    removed when the block ends."""
    workers = tuple(Host(f"rs-worker{i}-{tag}", f"{subnet}.{2 + i}") for i in range(worker_hosts))
    hosts = Hosts(f"rs-switch-{tag}", Host(f"rs-front-{tag}", f"{subnet}.1"), workers)
    try:
        for namespace in hosts.namespaces:
            _ip("netns", "add", namespace)
            _ip("-n", namespace, "link", "set", "lo", "up")
        _ip("-n", hosts.switch, "link", "add", "rsbr0", "type", "bridge")
        _ip("-n", hosts.switch, "link", "set", "rsbr0", "up")
        for i, host in enumerate([hosts.front_door, *hosts.workers]):
            port = f"rsport{i}"
            _ip("-n", hosts.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", host.namespace)
            _ip("-n", hosts.switch, "link", "set", port, "master", "rsbr0", "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.namespace, "link", "set", "eth0", "up")
        yield hosts
    finally:
        for namespace in hosts.namespaces:
            subprocess.run(["ip", "netns", "delete", namespace], check=False, capture_output=True)  # made or not


@contextlib.contextmanager
def inside(host: Host) -> Iterator[None]:
    """The calling thread in `host`'s network namespace for the block, then back in its own."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(Path("/run/netns") / host.namespace, os.O_RDONLY)
    try:
        _setns(target)
        yield
    finally:
        _setns(own)
        os.close(own)
        os.close(target)


def processes_in(namespace: str) -> list[int]:
    """The processes whose network is `namespace`'s (empty once everything started there has ended)."""
    done = subprocess.run(["ip", "netns", "pids", namespace], check=False, capture_output=True, text=True)
    return [int(pid) for pid in done.stdout.split()]


def assert_no_process_left(hosts: Hosts, timeout_s: float = 30.0) -> None:
    """Every process started in `hosts` has ended (waited for up to `timeout_s`: stopping takes a moment)."""
    deadline = time.monotonic() + timeout_s
    while any(processes_in(ns) for ns in hosts.namespaces) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(processes_in(ns) for ns in hosts.namespaces), "processes outlived the test"
