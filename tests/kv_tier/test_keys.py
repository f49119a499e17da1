"""Key scheme of tier objects: model, policy version, format and the token-block hash chain."""

import random

from engine.kv_tier.keys import KeyScheme, rank_key

BS = 32


def scheme(**changes) -> KeyScheme:
    fields = {"model_id": "tiny-qwen2", "policy_version": 3, "kv_format": "nvfp4", "block_size": BS}
    return KeyScheme(**{**fields, **changes})


def tokens(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(4160) for _ in range(n)]


def test_one_key_per_full_block_naming_model_version_and_format():
    keys = scheme().block_keys(tokens(3 * BS + 5))
    assert len(keys) == 3
    assert all(k.startswith("rs-kv/tiny-qwen2/v3/nvfp4/bs32/") for k in keys)
    assert len(set(keys)) == 3
    assert scheme().block_keys(tokens(BS - 1)) == []


def test_keys_are_deterministic_across_instances():
    assert scheme().block_keys(tokens(4 * BS)) == scheme().block_keys(list(tokens(4 * BS)))


def test_a_key_names_the_whole_prefix_up_to_its_block():
    base = tokens(5 * BS)
    changed = list(base)
    changed[2 * BS + 7] += 1  # a token of block 2
    a, b = scheme().block_keys(base), scheme().block_keys(changed)
    assert a[:2] == b[:2]
    assert all(x != y for x, y in zip(a[2:], b[2:]))


def test_a_longer_sequence_extends_the_keys_of_its_prefix():
    long = tokens(6 * BS)
    assert scheme().block_keys(long)[:4] == scheme().block_keys(long[: 4 * BS + 3])


def test_policy_version_model_format_adapter_and_salt_each_change_every_key():
    ids = tokens(3 * BS)
    base = set(scheme().block_keys(ids))
    for change in ({"policy_version": 4}, {"model_id": "other"}, {"kv_format": "float32"},
                   {"block_size": 16}, {"lora": "adapter-a"}, {"cache_salt": "s"}):
        assert base.isdisjoint(scheme(**change).block_keys(ids)), change


def test_tensor_parallel_ranks_get_their_own_keys():
    assert rank_key("k", 0, 1) == "k"
    assert rank_key("k", 0, 2) != rank_key("k", 1, 2)
