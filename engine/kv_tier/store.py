"""A Mooncake store client for KV blocks: existence checks, batched put and get of fixed-size objects.

The client contributes no memory to the store (global segment 0): the tier's DRAM is the segment
holder's (engine/supervisor/kv_tier_service.py). Objects move through one registered staging buffer, so a
batch of blocks is one `batch_put_from` / `batch_get_into` call (one transfer per object). Each object is
stored padded to its slot (engine/kv_tier/formats.py `slot_bytes`): the room it leaves when Mooncake evicts
it is then reusable by the next object, so a full tier keeps taking new blocks.
Connectors of the same process (vLLM's scheduler and worker sides) share one client.

The tier is a cache: when the master stops answering, every call fails (a get or put then takes
seconds, Mooncake retrying its RPC), so after a failure the client stays off for OUTAGE_BACKOFF_S
and the worker serves from its own cache meanwhile.
"""

from __future__ import annotations

import logging
import time
from functools import cache

import torch

from engine.kv_tier import native
from engine.kv_tier.formats import slot_bytes

log = logging.getLogger(__name__)

STAGING_BYTES = 64 * 2**20
LOCAL_BUFFER_BYTES = 16 * 2**20
CONNECT_ATTEMPTS = 30
OUTAGE_BACKOFF_S = 10.0
SLOW_FAILURE_S = 1.0  # a failed get/put this slow means Mooncake could not reach the master


class TierStore:
    def __init__(self, master_address: str):
        self.master_address = master_address
        self._client = None
        self._staging: torch.Tensor | None = None
        self._off_until = 0.0

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._off_until

    def _outage(self, what: str) -> None:
        log.warning("KV tier unreachable (%s): not used for %.0f s", what, OUTAGE_BACKOFF_S)
        self._off_until = time.monotonic() + OUTAGE_BACKOFF_S

    # ---- queries ------------------------------------------------------------------------------

    def exists(self, keys: list[str]) -> list[bool | None]:
        """Per key: True, False, or None when the store could not tell (treated as absent by callers)."""
        if not keys or not self.available:
            return [None] * len(keys)
        codes = self.client().batch_is_exist(keys)
        if any(code not in (0, 1) for code in codes):
            self._outage(f"lookup codes {sorted(set(codes))}")
        return [True if code == 1 else False if code == 0 else None for code in codes]

    def leading_hits(self, keys: list[str]) -> int:
        """How many of `keys`, from the first, are all in the store."""
        hits = 0
        for present in self.exists(keys):
            if not present:
                break
            hits += 1
        return hits

    # ---- transfers ----------------------------------------------------------------------------

    def put(self, keys: list[str], objects: torch.Tensor) -> int:
        """Stores uint8 objects [n, size] under `keys`; returns how many were stored (or already there)."""
        stored = 0
        size, slot = objects.shape[1], slot_bytes(objects.shape[1])
        for start, count in self._chunks(len(keys), slot):
            if not self.available:
                break
            self.staging()[: count * slot].view(count, slot)[:, :size].copy_(objects[start:start + count])
            started = time.monotonic()
            codes = self.client().batch_put_from(keys[start:start + count], self._pointers(count, slot),
                                                 [slot] * count)
            stored += sum(code == 0 for code in codes)
            if any(code != 0 for code in codes) and time.monotonic() - started > SLOW_FAILURE_S:
                self._outage("put")
        return stored

    def get(self, keys: list[str], out: torch.Tensor) -> list[bool]:
        """Reads the objects of `keys` into uint8 `out` [n, size]; per key, whether it arrived whole."""
        arrived: list[bool] = []
        size, slot = out.shape[1], slot_bytes(out.shape[1])
        for start, count in self._chunks(len(keys), slot):
            if not self.available:
                arrived += [False] * count
                continue
            started = time.monotonic()
            codes = self.client().batch_get_into(keys[start:start + count], self._pointers(count, slot), [slot] * count)
            out[start:start + count].copy_(self.staging()[: count * slot].view(count, slot)[:, :size])
            arrived += [code == slot for code in codes]
            if any(code != slot for code in codes) and time.monotonic() - started > SLOW_FAILURE_S:
                self._outage("get")
        return arrived

    # ---- connection ---------------------------------------------------------------------------

    def client(self):
        if self._client is None:
            self._client = self._connect()
        return self._client

    def staging(self) -> torch.Tensor:
        if self._staging is None:
            staging = torch.empty(STAGING_BYTES, dtype=torch.uint8)
            if self.client().register_buffer(staging.data_ptr(), STAGING_BYTES) != 0:
                raise RuntimeError("Mooncake refused to register the KV tier staging buffer")
            self._staging = staging
        return self._staging

    def _connect(self):
        store_class = native.store_class()
        for attempt in range(1, CONNECT_ATTEMPTS + 1):
            client = store_class()
            code = client.setup("127.0.0.1", "P2PHANDSHAKE", 0, LOCAL_BUFFER_BYTES, "tcp", "", self.master_address)
            if code == 0:
                log.info("connected to the KV tier (mooncake_master %s)", self.master_address)
                return client
            log.warning("KV tier master %s not reachable (code %d), attempt %d/%d",
                        self.master_address, code, attempt, CONNECT_ATTEMPTS)
            time.sleep(1.0)
        raise RuntimeError(f"cannot connect to the KV tier's mooncake_master at {self.master_address}")

    def _chunks(self, n: int, size: int):
        per_chunk = STAGING_BYTES // size
        if per_chunk == 0:
            raise ValueError(f"a KV block object of {size} bytes exceeds the {STAGING_BYTES}-byte staging buffer")
        for start in range(0, n, per_chunk):
            yield start, min(per_chunk, n - start)

    def _pointers(self, count: int, size: int) -> list[int]:
        base = self.staging().data_ptr()
        return [base + i * size for i in range(count)]


@cache
def shared_store(master_address: str) -> TierStore:
    return TierStore(master_address)
