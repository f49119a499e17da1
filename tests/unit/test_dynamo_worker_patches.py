"""engine/worker/dynamo_worker.py: Dynamo's worker keeps each logprob entry's id and logprob but decodes no text, and
leaves out "top logprobs" that only repeat the sampled tokens; vLLM's settings are cached once the engine is up;
the engine is warmed up before the worker registers."""

import asyncio
from types import SimpleNamespace

from vllm.logprobs import Logprob

from engine.worker import dynamo_worker


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


class RecordingEngine:  # test double: records what the warm-up asks of vLLM's engine client
    def __init__(self, log: list):
        self.log = log

    async def generate(self, prompt, params, request_id):
        self.log.append(("generate", prompt["prompt_token_ids"], params, request_id))
        yield SimpleNamespace(finished=True)


def test_the_engine_is_warmed_up_before_the_worker_registers(monkeypatch):
    from dynamo.vllm import main as dynamo_main

    log = []

    async def register(model_input, model_type, generate_endpoint, config, engine_client, vllm_config, worker_type,
                       needs=None):
        log.append(("register", model_input, worker_type))

    monkeypatch.setattr(dynamo_main, "register_vllm_model", register)
    dynamo_worker._warm_up_before_registering()
    asyncio.run(dynamo_main.register_vllm_model("tokens", "chat", "endpoint", "config", RecordingEngine(log),
                                                "vllm config", worker_type="aggregated"))

    assert [entry[0] for entry in log] == ["generate", "generate", "register"]
    assert log[-1] == ("register", "tokens", "aggregated")  # the worker's own arguments, passed on
    warm_ups = log[:2]
    assert len({request_id for *_, request_id in warm_ups}) == 2
    assert {params.temperature for _, _, params, _ in warm_ups} == {0.0, 1.0}  # greedy and sampled
    # Shorter than vLLM's smallest KV block (16): no block is filled, so nothing reaches the prefix cache,
    # the router's KV events or a KV tier.
    assert all(len(prompt) + params.max_tokens < 16 for _, prompt, params, _ in warm_ups)
