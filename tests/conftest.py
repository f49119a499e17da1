import os

import torch

# Kernel tests run Triton's interpreter on CPU. Triton reads TRITON_INTERPRET when it is first
# imported, and other test modules import it early (through vLLM and xgrammar): set it here, first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
