"""engine/dynamo_worker.py: Dynamo's worker keeps each logprob entry's id and logprob but decodes no text."""

from types import SimpleNamespace

from vllm.logprobs import Logprob

from engine import dynamo_worker


class CountingTokenizer:  # test double: Dynamo swallows a tokenizer's errors, so calls are counted instead
    def __init__(self):
        self.calls = 0

    def decode(self, ids):
        self.calls += 1
        return "text"


def test_logprob_entries_carry_ids_and_logprobs_without_text():
    dynamo_worker.patch_dynamo()
    from dynamo.vllm import handlers

    output = SimpleNamespace(token_ids=[7, 9], logprobs=[{7: Logprob(-0.5, rank=1), 3: Logprob(-1.5, rank=2)},
                                                          {9: Logprob(-0.25, rank=1)}])
    tokenizer = CountingTokenizer()
    log_probs, top = handlers.BaseWorkerHandler._extract_logprobs(output, 0, tokenizer=tokenizer)
    assert tokenizer.calls == 0
    assert log_probs == [-0.5, -0.25]
    assert [[(e["token_id"], e["logprob"], e["token"]) for e in position] for position in top] == [
        [(7, -0.5, None), (3, -1.5, None)], [(9, -0.25, None)]]
