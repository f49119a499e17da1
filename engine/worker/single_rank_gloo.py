"""Single-rank gloo process groups share one transport device, so one thread wakes instead of a dozen.

vLLM sets up torch.distributed even for a one-process engine: a dozen gloo process groups (world,
tensor-, pipeline-, data-, expert-parallel, ..., a CPU and a device group each) on which it runs no
collective. Each group makes its own gloo TCP device, and each device runs a thread that wakes every
10 ms whatever happens (gloo's epoll timeout), on the cores that the host processes of a CPU stack share
(engine/supervisor/cpu_placement.py). A group of one rank never connects to a peer, so its device carries
nothing, and every such group can have the same one. Groups of several ranks are made as torch makes them.
"""

from __future__ import annotations

import datetime
import functools
import logging

log = logging.getLogger(__name__)


def share_one_device_among_single_rank_groups() -> None:
    """Makes every gloo process group of one rank that this process creates from now on use one device."""
    from torch.distributed import distributed_c10d

    gloo = distributed_c10d.ProcessGroupGloo
    if getattr(gloo, "shares_one_device", False):
        return

    @functools.cache
    def one_device():
        log.info("single-rank gloo groups share one transport device (one thread waking every 10 ms)")
        return gloo.create_default_device()

    class ProcessGroupGlooSharingADevice(gloo):
        shares_one_device = True

        def __init__(self, store, rank, size, timeout=datetime.timedelta(minutes=30)):
            if size != 1 or not isinstance(timeout, datetime.timedelta):  # options given: made as asked
                super().__init__(store, rank, size, timeout)
                return
            options = gloo._Options()
            options._devices = [one_device()]
            options._timeout = timeout
            options._threads = 2  # torch's default for one device
            super().__init__(store, rank, size, options)

    distributed_c10d.ProcessGroupGloo = ProcessGroupGlooSharingADevice

