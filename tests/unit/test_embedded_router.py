"""engine/client/embedded_router.py without a stack: the request Dynamo's router and worker get, session pins, errors."""

import asyncio
import time

import pytest

from engine.client.embedded_router import _engine_error, _Silence, preprocessed_request
from engine.contract import EngineRequest, GuidedDecoding, SamplingParams
from engine.errors import EngineUnavailable, RequestRejected
from engine.sessions import SessionPins


def request(**fields) -> EngineRequest:
    defaults = dict(model="tiny-qwen2", request_id="r1", prompt_token_ids=[5, 6, 7], max_tokens=9)
    return EngineRequest(**{**defaults, **fields})


def test_the_request_carries_what_the_worker_needs_to_sample():
    req = request(sampling=SamplingParams(temperature=0.5, seed=3, n=2, stop=["x"], stop_token_ids=[11], min_tokens=2,
                                          include_stop_str_in_output=True),
                  top_logprobs=2, guided=GuidedDecoding("grammar", "root ::= \"a\""), stream_interval=8, cache_salt="salt")
    body = preprocessed_request(req, eos_token_ids=[2], adapter=False)
    assert body["token_ids"] == [5, 6, 7] and body["model"] == "tiny-qwen2"
    assert body["stop_conditions"] == {"max_tokens": 9, "min_tokens": 2, "ignore_eos": None, "stop_token_ids": [11],
                                       "stop_token_ids_hidden": [2]}
    assert body["sampling_options"] == {"n": 2, "temperature": 0.5, "seed": 3,
                                        "guided_decoding": {"grammar": "root ::= \"a\""}}
    assert body["output_options"] == {"logprobs": 2}
    assert body["annotations"] == ["rollout-serve:stream-interval=8"]
    assert body["routing"] == {"cache_salt": "salt"} and body["extra_args"] == {"nvext": {"cache_salt": "salt"}}


def test_logprobs_are_asked_only_when_wanted_and_eos_is_not_a_stop_with_ignore_eos():
    plain = preprocessed_request(request(logprobs=False, sampling=SamplingParams(ignore_eos=True)), [2], adapter=True)
    assert plain["output_options"] == {"logprobs": None}
    assert plain["stop_conditions"]["stop_token_ids_hidden"] is None
    assert plain["routing"] == {"lora_name": "tiny-qwen2"} and "annotations" not in plain
    assert preprocessed_request(request(), [2], adapter=False)["output_options"] == {"logprobs": 0}


def test_a_session_stays_pinned_until_it_idles_past_the_ttl(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("engine.sessions.time.monotonic", lambda: clock[0])
    pins = SessionPins(ttl_s=10)
    pins.pin("a", 1)
    pins.pin("b", 2)
    pins.pin(None, 3)  # a request without a session pins nothing
    clock[0] = 108.0
    assert (pins.worker_of("a"), pins.worker_of("b"), pins.worker_of(None)) == (1, 2, None)
    pins.pin("a", 1)  # a turn renews the pin
    clock[0] = 115.0
    assert (pins.worker_of("a"), pins.worker_of("b")) == (1, None)
    pins.unpin("a")
    assert pins.worker_of("a") is None


def test_past_its_size_the_least_recently_used_session_is_forgotten():
    pins = SessionPins(ttl_s=60, most=2)
    pins.pin("a", 1)
    pins.pin("b", 2)
    pins.pin("a", 1)
    pins.pin("c", 3)
    assert (pins.worker_of("a"), pins.worker_of("b"), pins.worker_of("c")) == (1, None, 3)


def test_a_refusal_the_worker_gives_keeps_its_status_and_anything_else_is_unavailable():
    refused = _engine_error(ValueError('InvalidRequest: {"message":"n must be 1 when using greedy sampling","code":400}'),
                            request())
    assert isinstance(refused, RequestRejected)
    assert (refused.status, refused.message) == (400, "n must be 1 when using greedy sampling")
    assert isinstance(_engine_error(ValueError('{"message":"worker failed","code":500}'), request()), EngineUnavailable)
    assert isinstance(_engine_error(RuntimeError("no endpoints available to route work"), request()), EngineUnavailable)
    assert isinstance(_engine_error(RuntimeError("broken {not json"), request()), EngineUnavailable)


class StalledStream:
    """A test double for Dynamo's response stream: one output, then nothing (a stalled worker)."""

    def __init__(self):
        self.sent = False

    async def __anext__(self):
        if not self.sent:
            self.sent = True
            return {"token_ids": [1]}
        await asyncio.sleep(3600)


def test_a_silent_engine_is_given_up_after_the_timeout_and_a_busy_one_is_not():
    async def run():
        silence = _Silence(0.2)
        try:
            first = await silence.next(StalledStream())
            await asyncio.sleep(0.3)  # the consumer busy elsewhere past the limit: no timeout meanwhile
            assert first == {"token_ids": [1]}
            stalled = StalledStream()
            stalled.sent = True
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                await silence.next(stalled)
            return time.monotonic() - started
        finally:
            silence.close()

    waited = asyncio.run(run())
    assert 0.15 <= waited < 1.0
