"""The fixed ports a stack listens on: free before it starts, and best kept below the kernel's ephemeral range.

A port inside that range can be taken at any moment by another process's outgoing connection or by a
listener bound to port 0 (vLLM and Dynamo open many). A child that then fails to bind may exit without
saying why (mooncake_master exits 1 with no error line), so the stack checks its ports first and names them.
"""

from __future__ import annotations

import functools
import logging
import socket
from pathlib import Path

log = logging.getLogger(__name__)

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@functools.cache
def ephemeral_range() -> range:
    """The ports the kernel hands out for outgoing connections and port-0 binds (Linux default 32768-60999)."""
    try:
        low, high = map(int, EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def is_free(port: int) -> bool:
    """Nothing listens on, or is connected from, `port` (sockets in TIME_WAIT do not count: servers reuse those)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def ports_in_use(wanted: dict[int, str]) -> list[str]:
    """The ports of `wanted` (port -> what listens there) that are taken, described; warns about ephemeral ones."""
    ephemeral = [f"{port} ({what})" for port, what in wanted.items() if port in ephemeral_range()]
    if ephemeral:
        log.warning("port(s) %s lie in the kernel's ephemeral range %d-%d: another process may take them first",
                    ", ".join(ephemeral), ephemeral_range().start, ephemeral_range().stop - 1)
    return [f"{port} ({what})" for port, what in sorted(wanted.items()) if not is_free(port)]
