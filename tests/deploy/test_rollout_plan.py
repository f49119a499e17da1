"""The rollout plan: the exact step order per mode, and the invariants that refuse unsafe plans."""

import pytest

from finetune_deploy.rollout_plan import KV_TIERS, PlanError, Step, check_plan, plan_rollout

PATH = "/ckpt/step-100"


def actions(steps):
    return [(step.worker, step.action) for step in steps]


def test_rolling_updates_one_worker_at_a_time():
    steps = plan_rollout(["w1", "w2", "w3"], "rolling", version=4, path=PATH)
    assert actions(steps) == [(w, a) for w in ("w1", "w2", "w3")
                              for a in ("pause", "update_weights", "reset_kv", "resume")]
    update = steps[1]
    assert (update.version, update.path, update.kind) == (4, PATH, "full")
    assert steps[2].tiers == KV_TIERS


def test_all_at_once_pauses_everyone_before_any_update_and_resumes_last():
    steps = plan_rollout(["w1", "w2"], "all_at_once", version=4, path=PATH, kind="lora", kv_tiers=("device",))
    assert actions(steps) == [("w1", "pause"), ("w2", "pause"), ("w1", "update_weights"), ("w2", "update_weights"),
                              ("w1", "reset_kv"), ("w2", "reset_kv"), ("w1", "resume"), ("w2", "resume")]
    assert {step.kind for step in steps if step.action == "update_weights"} == {"lora"}
    assert {step.tiers for step in steps if step.action == "reset_kv"} == {("device",)}


def test_a_single_worker_can_update_all_at_once_but_not_rolling():
    assert len(plan_rollout(["w1"], "all_at_once", 1, PATH)) == 4
    with pytest.raises(PlanError, match="at least 2"):
        plan_rollout(["w1"], "rolling", 1, PATH)


@pytest.mark.parametrize("workers, mode, kind, tiers, match", [
    ([], "all_at_once", "full", KV_TIERS, "no workers"),
    (["w1", "w1"], "all_at_once", "full", KV_TIERS, "unique"),
    (["w1", "w2"], "blue_green", "full", KV_TIERS, "mode"),
    (["w1", "w2"], "rolling", "delta", KV_TIERS, "kind"),
    (["w1", "w2"], "rolling", "full", ("gpu",), "tiers"),
    (["w1", "w2"], "rolling", "full", (), "tiers"),
])
def test_bad_requests_are_refused(workers, mode, kind, tiers, match):
    with pytest.raises(PlanError, match=match):
        plan_rollout(workers, mode, 1, PATH, kind=kind, kv_tiers=tiers)


def sequence(worker):
    return [Step(worker, "pause"), Step(worker, "update_weights", 1, PATH, "full"),
            Step(worker, "reset_kv", tiers=KV_TIERS), Step(worker, "resume")]


def test_check_refuses_two_workers_paused_at_once_in_rolling_mode():
    w1, w2 = sequence("w1"), sequence("w2")
    interleaved = [w1[0], w2[0], w1[1], w2[1], w1[2], w2[2], w1[3], w2[3]]
    with pytest.raises(PlanError, match="2 workers paused at once"):
        check_plan(interleaved, ["w1", "w2", "w3"], "rolling")
    check_plan(interleaved, ["w1", "w2"], "all_at_once")  # the same order is the synchronous plan


def test_check_refuses_pausing_the_only_worker_in_rolling_mode():
    with pytest.raises(PlanError, match="every worker is paused"):
        check_plan(sequence("w1"), ["w1"], "rolling")


def test_check_refuses_an_update_while_serving():
    w1 = sequence("w1")
    with pytest.raises(PlanError, match="does update_weights, expected pause"):
        check_plan(w1[1:], ["w1", "w2"], "rolling")


def test_check_refuses_a_worker_left_paused_or_unknown():
    with pytest.raises(PlanError, match="do not finish"):
        check_plan(sequence("w1") + sequence("w2")[:3], ["w1", "w2"], "rolling")
    with pytest.raises(PlanError, match="unknown worker"):
        check_plan(sequence("w9"), ["w1", "w2"], "rolling")
    with pytest.raises(PlanError, match="expected nothing more"):
        check_plan(sequence("w1") + sequence("w1") + sequence("w2"), ["w1", "w2"], "rolling")


def test_check_refuses_mixed_policies_in_all_at_once_mode():
    w1, w2 = sequence("w1"), sequence("w2")
    with pytest.raises(PlanError, match="while others still serve"):
        check_plan([w1[0], w1[1], w2[0], w2[1], w1[2], w2[2], w1[3], w2[3]], ["w1", "w2"], "all_at_once")
    with pytest.raises(PlanError, match="resumes before w2"):
        check_plan([w1[0], w2[0], w1[1], w2[1], w1[2], w1[3], w2[2], w2[3]], ["w1", "w2"], "all_at_once")
