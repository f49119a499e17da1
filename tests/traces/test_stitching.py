import numpy as np

from trace_pipeline.stitching import Turn, assemble, chain, leaves, link_parents


def turn(prompt, completion, logprobs=None, mask=None):
    logprobs = [-0.1 * (i + 1) for i in range(len(completion))] if logprobs is None else logprobs
    return Turn(np.array(prompt, dtype=np.int64), np.array(completion, dtype=np.int64),
                np.array(logprobs, dtype=np.float64), None if mask is None else np.array(mask, dtype=np.int8))


def test_a_turn_extending_the_previous_prompt_and_completion_continues_it():
    turns = [turn([1, 2], [3, 4], [-0.5, -0.25]), turn([1, 2, 3, 4, 9], [7], [-1.5])]
    parents = link_parents(turns)
    assert parents == [None, 0]
    assert leaves(parents) == [1]
    branch = assemble([turns[i] for i in chain(parents, 1)])
    assert branch.token_ids.tolist() == [1, 2, 3, 4, 9, 7]
    assert branch.mask.tolist() == [0, 0, 1, 1, 0, 1]
    assert branch.logprobs.tolist() == [0.0, 0.0, -0.5, -0.25, 0.0, -1.5]


def test_a_turn_that_does_not_extend_an_earlier_one_starts_a_new_trajectory():
    # Same prompt prefix, but the earlier completion [3, 4] was rewritten to [3, 5].
    turns = [turn([1, 2], [3, 4]), turn([1, 2, 3, 5, 9], [7])]
    parents = link_parents(turns)
    assert parents == [None, None]
    assert leaves(parents) == [0, 1]


def test_two_turns_continuing_one_parent_branch_the_trajectory():
    turns = [turn([1], [2]), turn([1, 2, 3], [4]), turn([1, 2, 5], [6])]
    parents = link_parents(turns)
    assert parents == [None, 0, 0]
    assert leaves(parents) == [1, 2]
    first = assemble([turns[i] for i in chain(parents, 1)])
    second = assemble([turns[i] for i in chain(parents, 2)])
    assert first.token_ids.tolist() == [1, 2, 3, 4] and first.mask.tolist() == [0, 1, 0, 1]
    assert second.token_ids.tolist() == [1, 2, 5, 6] and second.mask.tolist() == [0, 1, 0, 1]


def test_the_longest_extended_turn_is_the_parent():
    turns = [turn([1], [2]), turn([1, 2, 3], [4]), turn([1, 2, 3, 4, 5], [6])]
    assert link_parents(turns) == [None, 0, 1]
    assert chain(link_parents(turns), 2) == [0, 1, 2]


def test_a_turn_with_no_tokens_never_becomes_everyones_parent():
    turns = [turn([], []), turn([1], [2])]
    assert link_parents(turns) == [None, None]


def test_a_recorded_completion_mask_is_kept():
    turns = [turn([1], [2, 3, 4], mask=[1, 0, 1])]
    assert assemble(turns).mask.tolist() == [0, 1, 0, 1]
