"""Closed internal planes: every TCP socket a running stack listens on is bound to loopback (the front door's own
port too: the harness serves it on 127.0.0.1).

The sockets are read from /proc: each process's open socket inodes (/proc/PID/fd), matched against the
listening rows (state 0A) of /proc/PID/net/tcp and tcp6, for the front door and every process of its tree.
With the KV tier on, Mooncake's listeners too (their binds are guarded: engine/kv_tier/native.py)."""

import ipaddress
import os
import socket
import struct

import pytest

from engine.kv_tier.settings import KvTierSettings
from rollout_server.harness.stack import RunningStack, free_port_block, start_stack
from tests.security.conftest import stream_completion

pytestmark = pytest.mark.stack

LISTEN = "0A"


def _address(hex_address: str) -> str:
    """/proc/net/tcp* writes an address as the hex of its bytes in 32-bit host-order (little-endian) words."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(struct.pack("<I", word) for word in struct.unpack(f">{len(raw) // 4}I", raw))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, words)


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket process `pid` listens on, IPv4 and IPv6."""
    inodes = _socket_inodes(pid)
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == LISTEN and inode in inodes:
                    address, port = local.split(":")
                    found.append((_address(address), int(port, 16)))
    return found


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _describe(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")[:100].strip()
    return f"pid {pid} ({command})"


def open_listeners(stack: RunningStack) -> dict[int, str]:
    """Port -> the process and address, for every listening socket of the stack's processes not on loopback."""
    found = {}
    for pid in sorted({stack.process.pid, *stack.child_pids()}):
        try:
            found |= {port: f"{_describe(pid)} on {address}:{port}" for address, port in listening(pid)
                      if not _is_loopback(address)}
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited meanwhile (a short-lived helper)
    return found


def _report(found: dict[int, str]) -> str:
    return "listening beyond loopback:\n" + "\n".join(found.values())


def test_every_internal_listener_of_a_running_stack_binds_loopback(served_stack):
    found = open_listeners(served_stack)
    assert not found, _report(found)
    # and it still serves, streamed, through the planes it now reaches on loopback only
    assert stream_completion(served_stack.url, served_stack.model)


def test_with_the_kv_tier_every_internal_listener_binds_loopback(tmp_path_factory):
    tier = KvTierSettings(enabled=True, capacity_gib=0.25, nvfp4=False, port_base=free_port_block(3, start=32400))
    stack = start_stack(tmp_path_factory.mktemp("security-tier"), workers=1, extra_env=tier.as_env())
    try:
        stream_completion(stack.url, stack.model)
        found = open_listeners(stack)
        assert not found, _report(found)
    finally:
        stack.stop()
