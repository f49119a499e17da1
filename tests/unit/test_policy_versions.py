"""Which policy version sampled each token: the engine's runs read into tokens, the staleness budget, the runs
written into responses, and the workers a minimum version allows."""

from engine.contract import PolicyLag, SampledToken, stamp_versions
from engine.ids import PolicyVersion, WorkerId
from finetune_deploy.served_models import ModelTable
from rollout_server.serving.finished import policy_versions


def tokens(*versions) -> list[SampledToken]:
    return [SampledToken(100 + i, -0.5, [], v) for i, v in enumerate(versions)]


def test_the_engines_runs_stamp_each_token_by_its_output_index():
    message = tokens(*[None] * 5)  # output tokens 3..7 of their choice
    stamp_versions(message, 3, [["3", 0], ["4", 5], ["9", 7]])
    assert [t.policy_version for t in message] == [3, 3, 4, 4, 9]


def test_an_unlabelled_engine_stamps_nothing():
    message = tokens(None, None)
    stamp_versions(message, 0, [["default", 0]])
    assert [t.policy_version for t in message] == [None, None]
    stamp_versions(message, 0, None)
    assert [t.policy_version for t in message] == [None, None]


def test_the_budget_keeps_tokens_up_to_the_first_one_too_far_past_the_first_tokens_version():
    lag = PolicyLag(budget=1)
    assert lag.kept(tokens(3, 3)) == 2
    assert lag.kept(tokens(4, None, 4)) == 3  # one version past the start: within
    assert lag.kept(tokens(4, 5, 5)) == 1  # two past: the request ends before this token
    assert PolicyLag(budget=0).kept(tokens(7, 8)) == 1


def test_responses_carry_runs_indexed_from_the_choices_first_token():
    assert policy_versions(tokens(2, 2, 3, 3, 3)) == [{"version": 2, "first_token_index": 0},
                                                     {"version": 3, "first_token_index": 2}]
    assert policy_versions(tokens(3, 3), first_index=40) == [{"version": 3, "first_token_index": 40}]
    assert policy_versions([]) == []


def test_a_minimum_version_names_the_workers_already_switched_mid_rollout():
    table = ModelTable("base", PolicyVersion(1), "/ckpt/1")
    base = table.get("base")
    assert table.workers_at_least(base, PolicyVersion(1)) is None  # every worker: no restriction
    assert table.workers_at_least(base, PolicyVersion(2)) == frozenset()  # none yet
    table.worker_switched(WorkerId(7), PolicyVersion(2))
    assert table.workers_at_least(table.get("base"), PolicyVersion(2)) == {WorkerId(7)}
    table.base_switched(PolicyVersion(2), "/ckpt/2")
    assert table.workers_at_least(table.get("base"), PolicyVersion(2)) is None
    table.adapter_loaded("coder", PolicyVersion(3), "/lora/3")
    assert table.workers_at_least(table.get("coder"), PolicyVersion(3)) is None
    assert table.workers_at_least(table.get("coder"), PolicyVersion(4)) == frozenset()
