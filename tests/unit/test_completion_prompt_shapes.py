"""The four prompt shapes of /v1/completions, as the front door's CompletionRequest reads them. Its union
lists ids before texts (a long id prompt validates ~20x faster); each shape must still be read as before."""

import pytest
from pydantic import ValidationError

from rollout_server.protocol import CompletionRequest


@pytest.mark.parametrize("prompt, read_as", [
    ("hello", "hello"),
    (["hello", "world"], ["hello", "world"]),
    (["1", "2"], ["1", "2"]),            # texts that look like numbers stay texts
    ([5, 6, 7], [5, 6, 7]),
    ([1, "2"], [1, 2]),                  # a mixed list is coerced to ids, as pydantic's smart mode always did
    ([[1, 2], [3]], [[1, 2], [3]]),
    ([["1"], [2]], [[1], [2]]),
])
def test_each_shape_reads_as_before(prompt, read_as):
    assert CompletionRequest(model="m", prompt=prompt).prompt == read_as


@pytest.mark.parametrize("prompt", [[], [[]], [[1], []], [1.5], [None], [[1], "a"], 5])
def test_empty_or_malformed_prompts_are_refused(prompt):
    with pytest.raises(ValidationError):
        CompletionRequest(model="m", prompt=prompt)


def test_a_long_id_prompt_stays_ids():
    ids = list(range(140_000))
    assert CompletionRequest(model="m", prompt=ids).prompt == ids
