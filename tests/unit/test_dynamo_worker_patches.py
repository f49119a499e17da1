"""engine/dynamo_worker.py: Dynamo's worker keeps each logprob entry's id and logprob but decodes no text, and
leaves out "top logprobs" that only repeat the sampled tokens; vLLM's settings are cached once the engine is up."""

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


def test_top_logprobs_that_only_repeat_the_sampled_tokens_are_left_out():
    dynamo_worker.patch_dynamo()
    from dynamo.vllm import handlers

    alone = SimpleNamespace(token_ids=[7, 9], logprobs=[{7: Logprob(-0.5, rank=1)}, {9: Logprob(-0.25, rank=3)}])
    assert handlers.BaseWorkerHandler._extract_logprobs(alone, 0) == ([-0.5, -0.25], None)
    # One position with an alternative: every position keeps its list, so they stay aligned with log_probs.
    mixed = SimpleNamespace(token_ids=[7, 9], logprobs=[{7: Logprob(-0.5, rank=1)},
                                                         {9: Logprob(-0.25, rank=2), 4: Logprob(-0.1, rank=1)}])
    log_probs, top = handlers.BaseWorkerHandler._extract_logprobs(mixed, 0)
    assert log_probs == [-0.5, -0.25] and [[e["token_id"] for e in position] for position in top] == [[7], [9, 4]]


def test_vllm_settings_are_cached_once_the_engine_is_set_up(monkeypatch):
    import vllm.envs

    from dynamo.vllm import main as dynamo_main

    monkeypatch.setattr(dynamo_main, "setup_vllm_engine", lambda *args, **kwargs: "engine")
    monkeypatch.setattr(vllm.envs, "__getattr__", vllm.envs.__getattr__)  # restored after the test
    dynamo_worker._cache_vllm_envs_once_the_engine_is_up()
    assert not vllm.envs._is_envs_cache_enabled()
    assert dynamo_main.setup_vllm_engine("config") == "engine"
    assert vllm.envs._is_envs_cache_enabled()
