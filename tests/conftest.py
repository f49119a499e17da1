import os

import pytest
import torch

# Kernel tests run Triton's interpreter on CPU. Triton reads TRITON_INTERPRET when it is first
# imported, and other test modules import it early (through vLLM and xgrammar): set it here, first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test on a real stack reports the stack's logs too: CI keeps nothing else."""
    report = yield
    if report.failed:
        for stack in _running_stacks(getattr(item, "funcargs", {}).values()):
            report.sections.append(("rollout-serve logs", stack.diagnostics()))
    return report


def _running_stacks(values) -> list:
    """The RunningStacks among a test's fixture values, and inside a tuple, list or object among them."""
    from tests.stack_harness import RunningStack
    found = []
    for value in values:
        inner = value if isinstance(value, (tuple, list)) else getattr(value, "__dict__", {}).values()
        found += [v for v in [value, *inner] if isinstance(v, RunningStack) and v not in found]
    return found
