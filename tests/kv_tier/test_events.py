"""The tier's KV events for Dynamo's router (engine/kv_tier/events.py), on real vLLM requests."""

import msgspec
from vllm import SamplingParams
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash, maybe_convert_block_hash
from vllm.v1.request import Request

from engine.kv_tier.events import MEDIUM_TIER, TierEvents
from engine.kv_tier.policy import VersionFile, write_policy_version

BLOCK = 32


def request(tokens: list[int], request_id: str = "r1") -> Request:
    init_none_hash(sha256_cbor)
    return Request(request_id, tokens, SamplingParams(max_tokens=1), None,
                   block_hasher=get_request_block_hasher(BLOCK, sha256_cbor))


def test_a_saved_prefix_is_announced_with_vllms_own_block_hashes(tmp_path):
    events = TierEvents(BLOCK, VersionFile(tmp_path / "version", 0))
    req = request(list(range(100, 200)))            # 100 tokens: 3 full blocks
    events.stored(req, 3)
    [stored] = events.take()
    assert isinstance(stored, BlockStored) and stored.medium == MEDIUM_TIER == "CPU"
    assert stored.block_hashes == [maybe_convert_block_hash(h) for h in req.block_hashes[:3]]
    assert stored.parent_block_hash is None and stored.token_ids == list(range(100, 196))
    assert stored.block_size == BLOCK and stored.lora_name is None and stored.extra_keys == [None] * 3  # as vLLM sends
    msgspec.msgpack.encode(KVEventBatch(ts=0.0, events=[stored]))  # what vLLM's publisher sends

    events.stored(req, 3)
    assert events.take() == [], "a prefix already announced is not announced again"
    longer = request(list(range(100, 200)) + [7] * 40, "r2")
    events.stored(longer, 4)
    [grown] = events.take()
    assert grown.block_hashes[:3] == stored.block_hashes and len(grown.block_hashes) == 4


def test_a_policy_version_change_withdraws_every_announced_block(tmp_path):
    version_file = tmp_path / "version"
    write_policy_version(version_file, 0)
    events = TierEvents(BLOCK, VersionFile(version_file, 0))
    first, second = request(list(range(64)), "a"), request(list(range(500, 596)), "b")
    events.stored(first, 2)
    events.take()
    events.stored(second, 3)                          # announced, not yet taken, when the version moves
    write_policy_version(version_file, 1)
    [removed] = events.take()
    assert isinstance(removed, BlockRemoved) and removed.medium == "CPU"
    expected = [maybe_convert_block_hash(h) for h in first.block_hashes[:2] + second.block_hashes[:3]]
    assert sorted(removed.block_hashes) == sorted(expected)
    assert events.take() == []
    events.stored(first, 2)                           # saved again under the new version: announced again
    assert [type(e) for e in events.take()] == [BlockStored]


def test_the_announced_set_is_bounded(tmp_path):
    events = TierEvents(BLOCK, VersionFile(tmp_path / "version", 0), max_announced=4)
    for i in range(3):
        events.stored(request([i * 1000 + t for t in range(64)], f"r{i}"), 2)
    events.take()
    assert len(events._announced) == 4
