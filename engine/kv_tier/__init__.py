"""Host-DRAM KV tier on the Mooncake store (docs/kv_tier.md).

    vLLM worker --KvTierConnector--> Mooncake store client --TCP--> segment holder (mooncake_client, DRAM)
                                             `--RPC (metadata)--> mooncake_master

Finished requests' full KV blocks are saved, one object per block (all layers, block-major,
NVFP4 by default), under keys naming the model, the policy version and the token-block hash
chain; a later prompt whose prefix the worker's own cache misses loads them back.

This package's top level stays light (settings only): the front door imports the settings,
the vLLM worker imports `engine.kv_tier.connector`.
"""

from engine.kv_tier.settings import KvTierSettings

__all__ = ["KvTierSettings"]
