"""Weights broadcast over torch.distributed gloo: the CPU path of the tensor transport.

vLLM's weight-transfer engines (`vllm/distributed/weight_transfer`: nccl, ipc, ...) all move CUDA tensors; on a
CPU stack the same init -> start -> update -> finish flow runs over a gloo process group instead. Shared by its
three parties, each in its own process:
- the trainer (rank 0, the only sender; finetune_deploy/trainer_client.py), which hosts the rendezvous store;
- every inference rank (engine/worker/gloo_weight_transfer.py: vLLM's worker engine for backend "gloo");
- the recorder (finetune_deploy/weight_transfer.py): the front door's last rank, which writes what it receives
  as a checkpoint, so a pushed version can be restored, rolled back to and loaded by a restarted worker.

Rules, the same on every side so that no size ever travels with the bytes:
- A round's tensors are listed once (`GlooUpdateInfo`: names, dtypes, shapes, in sending order) and cut into
  buckets by `buckets`: a bucket closes with the tensor that takes it past `bucket_bytes` (vLLM's own packing
  rule, `packed_tensor.pack_tensors`), and the last one with the last tensor.
- A bucket travels as one broadcast of its tensors' bytes, concatenated in order.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

BACKEND = "gloo"
DEFAULT_BUCKET_BYTES = 64 * 2**20
DEFAULT_TIMEOUT_S = 120.0  # a collective that waits longer fails (a trainer gone mid-round)
DTYPE_NAMES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")


@dataclass
class GlooInitInfo:
    """How one receiving process joins the group (rank = rank_offset + its rank among the engine's ranks)."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass
class GlooUpdateInfo:
    """One round's tensors, in sending order."""

    names: list[str]
    dtype_names: list[str]  # torch dtype names: "float32", "bfloat16", ...
    shapes: list[list[int]]

    def __post_init__(self):
        if not (len(self.names) == len(self.dtype_names) == len(self.shapes)):
            raise ValueError(f"names, dtype_names and shapes must have one entry per tensor: got "
                             f"{len(self.names)}, {len(self.dtype_names)} and {len(self.shapes)}")
        for dtype_name in self.dtype_names:
            if dtype_name not in DTYPE_NAMES:
                raise ValueError(f"{dtype_name!r} is not one of the dtypes sent: {', '.join(DTYPE_NAMES)}")

    @classmethod
    def of(cls, listing: Iterable[tuple[str, torch.dtype, Iterable[int]]]) -> GlooUpdateInfo:
        """The round of these (name, dtype, shape), in this order."""
        names, dtypes, shapes = [], [], []
        for name, dtype, shape in listing:
            names.append(name)
            dtypes.append(str(dtype).removeprefix("torch."))
            shapes.append(list(shape))
        return cls(names, dtypes, shapes)

    def sizes(self) -> list[int]:
        return [math.prod(shape) * getattr(torch, dtype).itemsize for dtype, shape in zip(self.dtype_names, self.shapes)]

    def total_bytes(self) -> int:
        return sum(self.sizes())


def buckets(sizes: list[int], bucket_bytes: int) -> list[range]:
    """The tensors (by index) of each bucket: a bucket closes with the tensor that takes it past `bucket_bytes`."""
    cuts, start, filled = [], 0, 0
    for index, size in enumerate(sizes):
        filled += size
        if filled > bucket_bytes:
            cuts.append(range(start, index + 1))
            start, filled = index + 1, 0
    if start < len(sizes):
        cuts.append(range(start, len(sizes)))
    return cuts


def host_rendezvous(master_address: str, world_size: int, timeout_s: float, master_port: int = 0):
    """Rank 0's rendezvous store (port 0: a free one, then `store.port`); the other ranks join through it."""
    from torch.distributed import TCPStore

    return TCPStore(master_address, master_port, world_size, is_master=True, wait_for_workers=False,
                    timeout=datetime.timedelta(seconds=timeout_s))


def join(master_address: str, master_port: int, rank: int, world_size: int, timeout_s: float,
         store=None) -> torch.distributed.ProcessGroup:
    """This process's place in the group (rank 0 passes the store it hosts). Blocks until every rank has joined."""
    from torch.distributed import ProcessGroupGloo, TCPStore

    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = TCPStore(master_address, master_port, world_size, is_master=False, timeout=timeout)
    return ProcessGroupGloo(store, rank, world_size, timeout)


def send(group, tensors: Iterator[tuple[str, torch.Tensor]], update: GlooUpdateInfo, bucket_bytes: int) -> None:
    """Rank 0: broadcasts `tensors`, which must be those `update` lists, in its order."""
    sizes = update.sizes()
    for bucket in buckets(sizes, bucket_bytes):
        parts = []
        for index in bucket:
            name, tensor = next(tensors)
            if name != update.names[index] or list(tensor.shape) != update.shapes[index]:
                raise ValueError(f"tensor {index} is {name!r} {list(tensor.shape)}; the round listed "
                                 f"{update.names[index]!r} {update.shapes[index]}")
            parts.append(tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8))
        group.broadcast(torch.cat(parts), 0).wait()


def receive(group, update: GlooUpdateInfo, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Every other rank: the round's tensors, one bucket at a time (views of that bucket's bytes)."""
    sizes = update.sizes()
    for bucket in buckets(sizes, bucket_bytes):
        data = torch.empty(sum(sizes[i] for i in bucket), dtype=torch.uint8)
        group.broadcast(data, 0).wait()
        parts = data.split([sizes[i] for i in bucket])
        yield [(update.names[i], part.view(getattr(torch, update.dtype_names[i])).view(update.shapes[i]))
               for i, part in zip(bucket, parts)]
