"""Scheduler-side planning of the KV tier connector, against an in-memory test double of the store."""

import random
from dataclasses import dataclass, field

import pytest

from engine.kv_tier.keys import KeyScheme
from engine.kv_tier.plan import TierPlanner, lora_name
from engine.kv_tier.policy import VersionFile, Weights, write_adapter_version, write_policy_version

BS = 32


class InMemoryStoreDouble:
    """Test double of engine.kv_tier.store.TierStore: a set of keys."""

    def __init__(self):
        self.keys: set[str] = set()

    def exists(self, keys):
        return [key in self.keys for key in keys]

    def leading_hits(self, keys):
        hits = 0
        for key in keys:
            if key not in self.keys:
                break
            hits += 1
        return hits


@dataclass
class RequestDouble:
    """The fields of vllm.v1.request.Request the planner reads."""

    request_id: str
    all_token_ids: list[int]
    num_computed_tokens: int = 0
    lora_request: object = None
    cache_salt: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)


def tokens(n, seed=0):
    rng = random.Random(seed)
    return [rng.randrange(4160) for _ in range(n)]


def scheme_for(request, weights):
    return KeyScheme("tiny", weights.base, "nvfp4", BS, f"{lora_name(request)}@{weights.adapter}")


@pytest.fixture
def version_file(tmp_path):
    path = tmp_path / "policy-version"
    write_policy_version(path, 0)
    return path


@pytest.fixture
def store():
    return InMemoryStoreDouble()


@pytest.fixture
def planner(store, version_file):
    return TierPlanner(store, BS, VersionFile(version_file, 0), scheme_for)


def finish(planner, request, block_ids):
    request.num_computed_tokens = request.num_tokens - 1  # the last sampled token has no KV yet
    return planner.finished(request, block_ids)


def test_a_finished_request_saves_its_full_blocks_then_a_new_one_loads_them(planner, store):
    ids = tokens(5 * BS + 10)
    first = RequestDouble("a", ids)
    assert planner.match(first, 0) == 0
    assert finish(planner, first, [10, 11, 12, 13, 14, 15]) is True  # keep blocks until saved
    saves = planner.take_metadata().saves
    assert [(s.request_id, s.block_ids) for s in saves] == [("a", [10, 11, 12, 13, 14])]
    store.keys.update(saves[0].keys)

    again = RequestDouble("b", ids + tokens(3, seed=1))
    assert planner.match(again, 2 * BS) == 3 * BS  # blocks 2..4: the worker's own cache holds 0..1
    planner.allocated(again, [20, 21, 22, 23, 24, 25], 3 * BS)
    loads = planner.take_metadata().loads
    assert [(l.request_id, l.block_ids, l.keys) for l in loads] == [("b", [22, 23, 24], saves[0].keys[2:5])]


def test_only_the_leading_run_of_stored_blocks_is_loaded(planner, store):
    ids = tokens(6 * BS)
    keys = scheme_for(None, Weights(0)).block_keys(ids)
    store.keys.update([keys[0], keys[1], keys[3]])  # block 2 missing (evicted)
    assert planner.match(RequestDouble("r", ids), 0) == 2 * BS


def test_the_prompts_last_token_is_never_loaded(planner, store):
    ids = tokens(4 * BS)  # exactly 4 blocks: vLLM must compute the last token, so at most 3 load
    store.keys.update(scheme_for(None, Weights(0)).block_keys(ids))
    assert planner.match(RequestDouble("r", ids), 0) == 3 * BS


def test_blocks_already_in_the_tier_are_not_saved_again(planner, store):
    ids = tokens(3 * BS + 1)
    store.keys.update(scheme_for(None, Weights(0)).block_keys(ids)[:2])
    request = RequestDouble("r", ids)
    planner.match(request, 0)
    assert finish(planner, request, [5, 6, 7, 8]) is True
    assert [s.block_ids for s in planner.take_metadata().saves] == [[7]]
    full = RequestDouble("s", ids)
    store.keys.update(scheme_for(None, Weights(0)).block_keys(ids))
    planner.match(full, 0)
    assert finish(planner, full, [5, 6, 7, 8]) is False  # nothing to save: free the blocks now


def test_after_a_version_change_nothing_is_loaded_and_keys_carry_the_new_version(planner, store, version_file):
    ids = tokens(4 * BS + 3)
    store.keys.update(scheme_for(None, Weights(0)).block_keys(ids))
    write_policy_version(version_file, 1)
    request = RequestDouble("r", ids)
    assert planner.match(request, 0) == 0
    assert finish(planner, request, [1, 2, 3, 4, 5]) is True
    assert all("/v1/" in key for key in planner.take_metadata().saves[0].keys)


def test_a_request_that_spans_a_version_change_is_not_saved(planner, version_file):
    request = RequestDouble("r", tokens(3 * BS))
    planner.match(request, 0)
    write_policy_version(version_file, 1)
    assert finish(planner, request, [1, 2, 3]) is False
    assert planner.take_metadata().saves == []


@dataclass
class LoraDouble:
    lora_name: str


def test_an_adapter_deployed_again_under_its_name_is_other_weights(planner, store, version_file):
    """A trainer's next step of an adapter, under the same name and directory: none of the KV its previous
    version computed is loaded, and what it computes is saved under its own version."""
    ids = tokens(4 * BS + 3)
    write_adapter_version(version_file, "coder", 3)
    first = RequestDouble("a", ids, lora_request=LoraDouble("coder"))
    planner.match(first, 0)
    assert finish(planner, first, [1, 2, 3, 4, 5]) is True
    saved = planner.take_metadata().saves[0].keys
    store.keys.update(saved)
    assert planner.match(RequestDouble("b", ids, lora_request=LoraDouble("coder")), 0) == 4 * BS

    write_adapter_version(version_file, "coder", 4)
    again = RequestDouble("c", ids, lora_request=LoraDouble("coder"))
    assert planner.match(again, 0) == 0
    assert finish(planner, again, [1, 2, 3, 4, 5]) is True
    assert not set(planner.take_metadata().saves[0].keys) & set(saved)
    assert planner.match(RequestDouble("d", ids), 0) == 0  # nor do the base weights see the adapter's KV


def test_a_request_that_spans_an_adapter_update_is_not_saved(planner, version_file):
    write_adapter_version(version_file, "coder", 3)
    request = RequestDouble("r", tokens(3 * BS), lora_request=LoraDouble("coder"))
    planner.match(request, 0)
    write_adapter_version(version_file, "coder", 4)
    assert finish(planner, request, [1, 2, 3]) is False


def test_metadata_is_handed_out_once(planner):
    request = RequestDouble("r", tokens(2 * BS + 1))
    planner.match(request, 0)
    finish(planner, request, [1, 2, 3])
    assert len(planner.take_metadata().saves) == 1
    assert planner.take_metadata().saves == []
