"""The gloo weight broadcast's rules (engine/gloo_weights.py): buckets, and a round sent to two receivers."""

import threading

import pytest
import torch

from engine import gloo_weights
from engine.gloo_weights import GlooUpdateInfo, buckets


def test_a_bucket_closes_with_the_tensor_that_takes_it_past_the_limit():
    assert buckets([3, 3, 3], 5) == [range(0, 2), range(2, 3)]
    assert buckets([3, 3, 3], 6) == [range(0, 3)]  # reaching the limit is not passing it
    assert buckets([10, 1], 5) == [range(0, 1), range(1, 2)]  # a tensor larger than a bucket travels alone
    assert buckets([], 5) == []


def test_update_info_refuses_lists_of_different_lengths_and_unknown_dtypes():
    with pytest.raises(ValueError, match="one entry per tensor"):
        GlooUpdateInfo(["a", "b"], ["float32"], [[1], [2]])
    with pytest.raises(ValueError, match="not one of the dtypes sent"):
        GlooUpdateInfo(["a"], ["float33"], [[1]])


def _round(tensors: dict[str, torch.Tensor], bucket_bytes: int, sent: dict | None = None):
    """Rank 0 broadcasts `sent` (default: `tensors`) as the round `tensors` lists; returns what 2 receivers got."""
    update = GlooUpdateInfo.of((name, t.dtype, t.shape) for name, t in tensors.items())
    store = gloo_weights.host_rendezvous("127.0.0.1", 3, timeout_s=20)
    got, errors = {1: [], 2: []}, []

    def receiver(rank):
        try:
            group = gloo_weights.join("127.0.0.1", store.port, rank, 3, timeout_s=20)
            for bucket in gloo_weights.receive(group, update, bucket_bytes):
                got[rank].append([(name, tensor.clone()) for name, tensor in bucket])
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=receiver, args=(rank,)) for rank in (1, 2)]
    for thread in threads:
        thread.start()
    group = gloo_weights.join("127.0.0.1", store.port, 0, 3, timeout_s=20, store=store)
    try:
        gloo_weights.send(group, iter((sent or tensors).items()), update, bucket_bytes)
    finally:
        for thread in threads:
            thread.join(timeout=30)
    return got, errors


def test_every_receiver_gets_every_tensor_bit_for_bit_in_buckets():
    torch.manual_seed(0)
    tensors = {"embed.weight": torch.randn(64, 16), "layers.0.norm": torch.randn(16).to(torch.bfloat16),
               "layers.0.proj": torch.randn(16, 16), "empty": torch.zeros(0, 4)}
    got, errors = _round(tensors, bucket_bytes=1024)
    assert not errors
    for rank in (1, 2):
        # 4096 B, then 32 + 1024 B (past 1024 with the second), then the empty one
        assert [[name for name, _ in bucket] for bucket in got[rank]] == [
            ["embed.weight"], ["layers.0.norm", "layers.0.proj"], ["empty"]]
        received = dict(pair for bucket in got[rank] for pair in bucket)
        assert received.keys() == tensors.keys()
        for name, tensor in tensors.items():
            assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor)


def test_the_sender_refuses_tensors_other_than_the_round_lists():
    tensors = {"a": torch.ones(2), "b": torch.ones(3)}
    store = gloo_weights.host_rendezvous("127.0.0.1", 1, timeout_s=5)
    group = gloo_weights.join("127.0.0.1", store.port, 0, 1, timeout_s=5, store=store)
    update = GlooUpdateInfo.of((name, t.dtype, t.shape) for name, t in tensors.items())
    with pytest.raises(ValueError, match="tensor 1 is 'c'"):
        gloo_weights.send(group, iter({"a": torch.ones(2), "c": torch.ones(3)}.items()), update, 1024)
