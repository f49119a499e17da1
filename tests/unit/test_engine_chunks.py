"""engine/client/dynamo_http.py turns Dynamo's completion chunks into sampled tokens with their logprobs."""

from engine.client.dynamo_http import _parse_chunk


def _chunk(top_logprobs: list) -> dict:
    return {"choices": [{"index": 0, "text": "ab", "logprobs": {
        "tokens": ["token_id:7", "token_id:9"], "token_logprobs": [-0.5, -0.25], "top_logprobs": top_logprobs}}]}


def _tokens(payload: dict, top_logprobs: int) -> list:
    return [(t.token_id, t.logprob, t.top) for t in _parse_chunk(payload, top_logprobs).deltas[0].tokens]


def test_without_alternatives_asked_only_the_sampled_tokens_are_read():
    assert _tokens(_chunk([{"token_id:7": -0.5, "token_id:3": -1.0}, {}]), 0) == [(7, -0.5, []), (9, -0.25, [])]


def test_alternatives_come_sorted_by_logprob():
    chunk = _chunk([{"token_id:3": -1.0, "token_id:7": -0.5}, {"token_id:9": -0.25, "token_id:4": -0.1}])
    assert _tokens(chunk, 2) == [(7, -0.5, [(7, -0.5), (3, -1.0)]), (9, -0.25, [(4, -0.1), (9, -0.25)])]


def test_a_position_without_its_list_held_the_sampled_token_alone():
    # Our worker leaves out lists that only repeat the sampled tokens (engine/worker/dynamo_worker.py): asked for
    # one alternative, the sampled token was the most likely one.
    assert _tokens(_chunk([]), 1) == [(7, -0.5, [(7, -0.5)]), (9, -0.25, [(9, -0.25)])]
