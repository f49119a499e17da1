"""Store keys of KV blocks: model, policy version, stored format, and the token-block hash chain.

    rs-kv/<model>/v<policy version>/<format>/bs<block size>/<chain hash of blocks 0..i>

Block i's hash covers every token of blocks 0..i (each hash is fed the previous one), so a key
names a whole prefix: two prompts share block i's object only if they agree on all tokens up to
the end of block i. The chain starts from the LoRA adapter and vLLM's cache salt, so KV computed
with an adapter (or under a salt) is never served to another. The version in the key means KV
computed by one set of weights is never looked up under another (engine/kv_tier/policy.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

NAMESPACE = "rs-kv"
HASH_BYTES = 16


@dataclass(frozen=True)
class KeyScheme:
    model_id: str
    policy_version: int
    kv_format: str  # "nvfp4", or the cache dtype for lossless blocks ("float32", "bfloat16", ...)
    block_size: int
    lora: str = ""
    cache_salt: str = ""

    @property
    def prefix(self) -> str:
        return f"{NAMESPACE}/{self.model_id}/v{self.policy_version}/{self.kv_format}/bs{self.block_size}"

    def block_keys(self, token_ids: Sequence[int]) -> list[str]:
        """One key per full block of `token_ids` (a trailing partial block gets none)."""
        return [f"{self.prefix}/{digest.hex()}" for digest in self.chain(token_ids)]

    def chain(self, token_ids: Sequence[int]) -> list[bytes]:
        tokens = np.asarray(token_ids, dtype=np.uint32)
        previous = hashlib.blake2b(f"{self.lora}\0{self.cache_salt}".encode(), digest_size=HASH_BYTES).digest()
        digests = []
        for start in range(0, len(tokens) - self.block_size + 1, self.block_size):
            block = tokens[start:start + self.block_size].astype("<u4").tobytes()
            previous = hashlib.blake2b(previous + block, digest_size=HASH_BYTES).digest()
            digests.append(previous)
        return digests


def rank_key(key: str, tp_rank: int, tp_size: int) -> str:
    """With tensor parallelism each rank stores its own heads of a block under its own key."""
    return key if tp_size == 1 else f"{key}@tp{tp_rank}of{tp_size}"
