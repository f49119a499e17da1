"""The real Mooncake tier without vLLM: mooncake_master + segment holder on loopback, our store client."""

import time

import pytest
import torch

from engine.kv_tier.formats import slot_bytes
from engine.kv_tier.settings import KvTierSettings
from engine.kv_tier.store import TierStore
from engine.supervisor import kv_tier_service
from engine.supervisor.processes import ChildProcess, stop_all
from rollout_server.harness.stack import free_port_block

CAPACITY_GIB = 0.125  # 128 MiB


def start_tier(run_dir, start_port: int) -> tuple[KvTierSettings, list[ChildProcess]]:
    settings = KvTierSettings(enabled=True, capacity_gib=CAPACITY_GIB, port_base=free_port_block(3, start=start_port))
    children = [ChildProcess(kv_tier_service.master_spec(settings, run_dir)),
                ChildProcess(kv_tier_service.holder_spec(settings, run_dir))]
    for child in children:
        child.start()
    deadline = time.monotonic() + 60
    while not kv_tier_service.is_ready(settings):
        assert all(c.alive() for c in children), "\n".join(c.log_tail() for c in children)
        assert time.monotonic() < deadline, "tier not ready in 60 s:\n" + "\n".join(c.log_tail() for c in children)
        time.sleep(0.5)
    return settings, children


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    settings, children = start_tier(tmp_path_factory.mktemp("tier"), 32100)
    yield settings
    stop_all(children)


@pytest.fixture(scope="module")
def store(tier):
    return TierStore(tier.master_address)


def objects(n: int, size: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_ready_means_the_whole_capacity_is_mounted(tier):
    metrics = kv_tier_service.read_metrics(tier)
    assert metrics.capacity_bytes == tier.capacity_bytes


def test_put_then_get_returns_the_same_bytes(tier, store):
    data = objects(5, 36_880, seed=0)
    keys = [f"test/put-get/{i}" for i in range(5)]
    before = kv_tier_service.read_metrics(tier)
    assert store.put(keys, data) == 5
    out = torch.zeros_like(data)
    assert store.get(keys, out) == [True] * 5
    assert torch.equal(out, data)
    after = kv_tier_service.read_metrics(tier)
    assert after.keys == before.keys + 5
    assert after.get_requests >= before.get_requests + 5


def test_exists_and_leading_hits(store):
    keys = [f"test/exists/{i}" for i in range(4)]
    store.put([keys[0], keys[1], keys[3]], objects(3, 1024, seed=1))
    assert store.exists(keys) == [True, True, False, True]
    assert store.leading_hits(keys) == 2
    assert store.leading_hits([]) == 0


def test_a_missing_object_is_reported_not_invented(store):
    out = torch.zeros(2, 1024, dtype=torch.uint8)
    store.put(["test/missing/0"], objects(1, 1024, seed=2))
    assert store.get(["test/missing/0", "test/missing/1"], out) == [True, False]


def test_batches_larger_than_the_staging_buffer_are_split(store):
    from engine.kv_tier.store import STAGING_BYTES

    size = STAGING_BYTES // 3 + 1  # 2 objects per staging chunk
    data = objects(3, size, seed=3)
    keys = [f"test/chunks/{i}" for i in range(3)]
    assert store.put(keys, data) == 3
    out = torch.zeros_like(data)
    assert store.get(keys, out) == [True] * 3
    assert torch.equal(out, data)


def test_a_full_tier_evicts_old_objects_to_take_new_ones(tier, store):
    size = 2**20
    per_batch = int(CAPACITY_GIB * 2**30) // size // 8  # each batch an eighth of the capacity: 16 fill it twice
    for batch in range(2 * 8):
        keys = [f"test/evict/{batch}/{i}" for i in range(per_batch)]
        data = objects(per_batch, size, seed=batch)
        deadline = time.monotonic() + 30
        # Near full, puts fail until Mooncake's background eviction (past its high watermark) frees room.
        while missing := [i for i, there in enumerate(store.exists(keys)) if not there]:
            assert time.monotonic() < deadline, f"batch {batch}: {len(missing)} objects never fit"
            store.put([keys[i] for i in missing], data[missing])
            time.sleep(0.2)
    metrics = kv_tier_service.read_metrics(tier)
    assert metrics.allocated_bytes <= tier.capacity_bytes
    assert metrics.evicted_keys >= per_batch  # the master counts what it evicted (the tier-fill benchmark reads it)
    assert store.exists([f"test/evict/0/{i}" for i in range(per_batch)]).count(True) < per_batch  # old ones went


def test_a_full_tier_takes_whole_batches_of_objects_of_any_size(tmp_path):
    """An NVFP4 block of the tiny model is 18,464 bytes, not a size Mooncake's allocator can reuse as such: stored
    as is, a full tier refused more than half of each batch saved (the room evicted objects left was unusable).
    A tier of its own, filled with these objects only."""
    settings, children = start_tier(tmp_path, 32250)
    try:
        store = TierStore(settings.master_address)
        size = 18_464
        # A batch takes 5% of the tier in slots (what one eviction frees), so that a batch put at <= 90% full
        # fits: the master evicts 5% of its objects in the background once past 90% (its high watermark).
        per_batch = int(CAPACITY_GIB * 2**30) // slot_bytes(size) // 20
        stored = []
        for batch in range(32):  # 1.6x the capacity
            keys = [f"test/full/{batch}/{i}" for i in range(per_batch)]
            stored.append(store.put(keys, objects(per_batch, size, seed=100 + batch)))
            # The next batch waits for the eviction (10 s at most), so that only the allocator's room, not the
            # eviction's timing, decides what is stored.
            deadline = time.monotonic() + 10
            while (kv_tier_service.read_metrics(settings).allocated_bytes > 0.9 * settings.capacity_bytes
                   and time.monotonic() < deadline):
                time.sleep(0.05)
        assert kv_tier_service.read_metrics(settings).evicted_keys > 0  # the tier was full ...
        assert stored[-12:] == [per_batch] * 12  # ... and kept taking every object saved
    finally:
        stop_all(children)


def test_when_the_master_dies_the_store_fails_fast_instead_of_stalling_every_call(tmp_path):
    settings, children = start_tier(tmp_path, 32200)
    try:
        store = TierStore(settings.master_address)
        data = objects(2, 4096, seed=4)
        assert store.put(["test/outage/0", "test/outage/1"], data) == 2
        stop_all(children[:1])  # the master
        out = torch.zeros_like(data)
        # The first calls find out, slowly (Mooncake retries its RPC for seconds) ...
        assert store.get(["test/outage/0", "test/outage/1"], out) == [False, False]
        assert store.exists(["test/outage/0"]) == [None]
        assert not store.available
        # ... then the tier is left alone for a while: every call answers "not there" at once.
        started = time.monotonic()
        for _ in range(5):
            assert store.exists(["test/outage/0"]) == [None]
            assert store.get(["test/outage/0"], out[:1]) == [False]
            assert store.put(["test/outage/2"], data[:1]) == 0
        assert time.monotonic() - started < 3, "calls went to the unreachable master again (each takes seconds)"
    finally:
        stop_all(children)
