"""engine/worker/cpu_seeded_chunks.py on a test double of vLLM's model runner: the generator of a request whose
sample is thrown away (a partial prefill step) ends the step as it began; the others advance. The real
engine is exercised by tests/api/test_openai_api.py (a seeded long prompt, chunked and cached)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine.worker.cpu_seeded_chunks import _restoring_discarded_generators, _without_discarded_generators


class RunnerDouble:
    """Test double: two seeded requests; row 0 is still prefilling (its sample is discarded)."""

    def __init__(self):
        self.input_batch = SimpleNamespace(num_reqs=2, generators={0: torch.Generator().manual_seed(1),
                                                                   1: torch.Generator().manual_seed(2)})
        self.discard_request_mask = SimpleNamespace(np=np.array([True, False]))

    def _sample(self):
        return [torch.rand(4, generator=self.input_batch.generators[i]) for i in (0, 1)]

    def _bookkeeping_sync(self):
        for i in np.nonzero(self.discard_request_mask.np)[0]:  # what vLLM does; CPU generators refuse it
            gen = self.input_batch.generators.get(int(i))
            if gen is not None:
                gen.set_offset(gen.get_offset() - 4)


def test_vllms_rewind_fails_on_a_cpu_generator():
    runner = RunnerDouble()
    with pytest.raises(RuntimeError, match="offset"):
        runner._bookkeeping_sync()


def test_a_discarded_sample_leaves_its_generator_where_it_was_and_the_others_advance():
    runner = RunnerDouble()
    before = {i: g.get_state() for i, g in runner.input_batch.generators.items()}
    sample = _restoring_discarded_generators(RunnerDouble._sample)
    bookkeeping = _without_discarded_generators(RunnerDouble._bookkeeping_sync)

    first = sample(runner)
    bookkeeping(runner)
    generators = runner.input_batch.generators
    assert torch.equal(generators[0].get_state(), before[0])
    assert not torch.equal(generators[1].get_state(), before[1])
    assert set(generators) == {0, 1}, "the generators are all back after the bookkeeping"
    # The prefill goes on: the next step samples request 0 exactly as the first did.
    runner.discard_request_mask.np[:] = False
    assert torch.equal(sample(runner)[0], first[0])
