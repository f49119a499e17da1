"""Stitches the calls of one session into trajectories, by token ids alone.

A turn continues an earlier turn when its prompt token ids start with that turn's
prompt + completion token ids (the earlier turn's parent is the longest such turn;
ties go to the latest). A turn that extends no earlier turn starts a new
trajectory. Several turns continuing one parent branch the trajectory there. Each
leaf of the resulting forest is one branch: one training sample whose tokens are
the leaf's prompt + completion, with every ancestor's completion at its position.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Turn:
    prompt: np.ndarray             # int64 token ids
    completion: np.ndarray         # int64 token ids
    logprobs: np.ndarray           # float64, one per completion token
    mask: np.ndarray | None        # int8 per completion token; None = all ones
    versions: np.ndarray | None = None  # int64 policy version per completion token; None = unknown (-1)


def _extends(prompt: np.ndarray, earlier: Turn) -> bool:
    head, tail = len(earlier.prompt), len(earlier.prompt) + len(earlier.completion)
    return (0 < tail <= len(prompt)
            and np.array_equal(prompt[:head], earlier.prompt)
            and np.array_equal(prompt[head:tail], earlier.completion))


def link_parents(turns: list[Turn]) -> list[int | None]:
    """parents[i] is the index of the turn that turn i continues, or None. turns are in time order."""
    parents: list[int | None] = []
    for i, turn in enumerate(turns):
        best, best_len = None, 0
        for j in range(i):
            length = len(turns[j].prompt) + len(turns[j].completion)
            if length >= best_len and _extends(turn.prompt, turns[j]):
                best, best_len = j, length
        parents.append(best)
    return parents


def leaves(parents: list[int | None]) -> list[int]:
    has_child = {p for p in parents if p is not None}
    return [i for i in range(len(parents)) if i not in has_child]


def chain(parents: list[int | None], leaf: int) -> list[int]:
    """Turn indices from the trajectory's root down to leaf."""
    path = [leaf]
    while parents[path[-1]] is not None:
        path.append(parents[path[-1]])
    return path[::-1]


@dataclass
class Branch:
    token_ids: np.ndarray          # int64
    mask: np.ndarray               # int8: 1 on sampled (completion) tokens, 0 on prompt tokens
    logprobs: np.ndarray           # float64: the sampled token's logprob, 0.0 on prompt tokens
    policy_versions: np.ndarray    # int64: the policy version that sampled the token, -1 on prompt tokens


def assemble(path: list[Turn]) -> Branch:
    """The branch ending at path[-1]; path holds the turns from the root down to it."""
    leaf = path[-1]
    token_ids = np.concatenate([leaf.prompt, leaf.completion])
    mask = np.zeros(len(token_ids), dtype=np.int8)
    logprobs = np.zeros(len(token_ids), dtype=np.float64)
    versions = np.full(len(token_ids), -1, dtype=np.int64)
    for turn in path:
        start, n = len(turn.prompt), len(turn.completion)
        mask[start:start + n] = 1 if turn.mask is None else turn.mask
        k = min(n, len(turn.logprobs))   # a turn recorded without logprobs keeps 0.0
        logprobs[start:start + k] = turn.logprobs[:k]
        if turn.versions is not None:
            versions[start:start + n] = turn.versions
    return Branch(token_ids, mask, logprobs, versions)
