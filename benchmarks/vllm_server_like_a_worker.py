"""vLLM's own OpenAI server, its processes placed as in a rollout-serve stack on CPU (engine/supervisor/cpu_placement.py):
the model runner inside the engine core, pinned to VLLM_CPU_OMP_THREADS_BIND's cores, and the API server on
the other cores. The front door benchmark's baseline: the same engine, without our layers in front.

Usage: python benchmarks/vllm_server_like_a_worker.py <vllm.entrypoints.openai.api_server arguments>
"""

import os
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.supervisor import cpu_placement  # noqa: E402
from engine.worker import engine_core_placement  # noqa: E402

engine_core_placement.run_model_runner_in_engine_core()  # at import: the spawned engine core imports this file too

if __name__ == "__main__":
    from vllm.utils.cpu_resource_utils import parse_id_list

    cpu_placement.keep_host_processes_off(set(parse_id_list(os.environ["VLLM_CPU_OMP_THREADS_BIND"])))
    # Without alter_sys: the spawned engine core must import this file as its main module, not vLLM's.
    sys.argv[0] = "vllm.entrypoints.openai.api_server"
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__")
