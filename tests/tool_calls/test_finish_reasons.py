import pytest

from rollout_server.tool_calls import ParsedOutput, finish_reason_for

CALL = {"id": "call_1", "type": "function", "function": {"name": "ping", "arguments": "{}"}}


@pytest.mark.parametrize(
    ("parsed", "vllm_reason", "expected"),
    [
        (ParsedOutput("hi"), "stop", "stop"),
        (ParsedOutput("hi"), "length", "length"),
        (ParsedOutput(None, [CALL]), "stop", "tool_calls"),
        (ParsedOutput(None, [CALL]), "length", "length"),
        # A call cut by a stop string or max_tokens is never reported as "stop".
        (ParsedOutput(None, [CALL], cut_call=True), "stop", "length"),
        (ParsedOutput(None, [], cut_call=True), "stop", "length"),
        (ParsedOutput(None, [CALL], cut_call=True), "length", "length"),
        (ParsedOutput("<tool_call>junk", malformed_call=True), "stop", "error"),
        (ParsedOutput(None, [CALL], cut_call=True), "abort", "abort"),
        (ParsedOutput("partial", [CALL]), None, "tool_calls"),
    ],
)
def test_finish_reason(parsed, vllm_reason, expected):
    assert finish_reason_for(parsed, vllm_reason) == expected
