"""The per-request stream interval's trip from the front door's request body to vLLM's SamplingParams."""

from vllm import SamplingParams

from engine import stream_interval
from engine.client.dynamo_http import DynamoFrontendClient
from engine.contract import EngineRequest


def request(interval: int) -> EngineRequest:
    return EngineRequest(model="m", request_id="r", prompt_token_ids=[1, 2], max_tokens=4,
                         stream_interval=interval)


def test_the_body_carries_the_interval_as_an_annotation_only_when_it_gathers_tokens():
    client = DynamoFrontendClient("http://127.0.0.1:9")
    assert "annotations" not in client._body(request(1))["nvext"]
    annotations = client._body(request(16))["nvext"]["annotations"]
    assert stream_interval.from_annotations(annotations) == 16


def test_the_worker_sets_the_annotated_interval_and_leaves_other_requests_alone():
    def dynamo_builder(request, defaults, max_len, enable_rl=False):  # a test double of Dynamo's builder
        return SamplingParams(max_tokens=4)

    build = stream_interval.honouring_annotation(dynamo_builder)
    annotated = {"annotations": ["x-bypass-remote-prefill", stream_interval.annotation(8)]}
    assert build(annotated, {}, 128, enable_rl=False).stream_interval == 8
    assert build({"annotations": ["x-bypass-remote-prefill"]}, {}, 128).stream_interval is None
    assert build({}, {}, 128).stream_interval is None
