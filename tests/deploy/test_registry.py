"""The checkpoint registry: versions only grow, deploys and rollbacks leave a history, all of it durable."""

import pytest
from sqlalchemy import create_engine

from finetune_deploy.checkpoints import CheckpointError
from finetune_deploy.registry import CheckpointRegistry, RegistryError
from rollout_server.harness.checkpoints import copy_checkpoint, write_lora_adapter

POOL = "qwen-tiny"


@pytest.fixture
def registry(database_url, base_dir):
    registry = CheckpointRegistry(create_engine(database_url))
    registry.register_base(POOL, base_dir, "tiny-qwen2")
    return registry


@pytest.fixture
def checkpoints(tmp_path, finetuned_dir):
    """Three finished full checkpoints (same content, distinct directories)."""
    return [copy_checkpoint(finetuned_dir, tmp_path / f"step-{step}") for step in (100, 200, 300)]


def deploy(registry, version, message="ok"):
    registry.mark_status(POOL, version, "deploying", "starting")
    return registry.mark_status(POOL, version, "serving", message)


def test_the_base_model_is_version_0_and_serves(registry, base_dir):
    base = registry.current(POOL)
    assert (base.version, base.status, base.kind, base.parent_version) == (0, "serving", "full", None)
    assert base.path == str(base_dir.resolve()) and len(base.fingerprint) == 64
    assert registry.register_base(POOL, base_dir, "tiny-qwen2") == base
    assert registry.previous(POOL) is None


def test_a_pool_keeps_its_base(registry, finetuned_dir):
    with pytest.raises(RegistryError, match="new base is a new pool"):
        registry.register_base(POOL, finetuned_dir, "other")


def test_registering_validates_first_and_records_nothing_on_refusal(registry, tmp_path, finetuned_dir):
    unfinished = copy_checkpoint(finetuned_dir, tmp_path / "writing", stable=False)
    with pytest.raises(CheckpointError):
        registry.register(POOL, unfinished)
    assert [v.version for v in registry.list(POOL)] == [0]


def test_versions_grow_and_record_what_they_are(registry, checkpoints, tmp_path, base_dir):
    first = registry.register(POOL, checkpoints[0], name="tiny-step-100", message="from run 7")
    adapter = registry.register(POOL, write_lora_adapter(tmp_path / "adapter", base_dir))
    assert (first.version, first.kind, first.status, first.parent_version) == (1, "full", "registered", 0)
    assert first.name == "tiny-step-100" and first.path == str(checkpoints[0].resolve())
    assert (adapter.version, adapter.kind, adapter.name) == (2, "lora", "adapter")
    assert [e.message for e in registry.events(POOL, 1)] == ["from run 7"]


def test_finishing_a_deploy_retires_the_previous_version(registry, checkpoints):
    version = registry.register(POOL, checkpoints[0]).version
    registry.mark_status(POOL, version, "deploying", "rolling over 2 workers")
    assert registry.current(POOL).version == 0  # still the base until the deploy finishes
    deploy_done = registry.mark_status(POOL, version, "serving", "2/2 workers on v1")
    assert deploy_done.status == "serving" and registry.current(POOL).version == version
    assert registry.get(POOL, 0).status == "retired"
    assert registry.previous(POOL).version == 0
    assert [(e.event, e.message) for e in registry.events(POOL, version)] == [
        ("registered", ""), ("deploy_started", "rolling over 2 workers"), ("deploy_finished", "2/2 workers on v1")]
    assert registry.events(POOL, 0)[-1].message == "replaced by version 1"


def test_a_failed_deploy_leaves_the_serving_version_alone(registry, checkpoints):
    version = registry.register(POOL, checkpoints[0]).version
    registry.mark_status(POOL, version, "deploying")
    registry.mark_status(POOL, version, "failed", "worker w1: out of memory")
    assert registry.current(POOL).version == 0 and registry.get(POOL, version).status == "failed"
    assert registry.events(POOL, version)[-1].event == "deploy_failed"
    assert deploy(registry, version).status == "serving"  # a failed version may be retried


def test_rollback_reactivates_the_older_version_and_never_reuses_numbers(registry, checkpoints):
    for checkpoint in checkpoints[:2]:
        deploy(registry, registry.register(POOL, checkpoint).version)
    assert (registry.current(POOL).version, registry.previous(POOL).version) == (2, 1)

    target = registry.rollback(POOL, "reward collapsed")
    assert (target.version, target.status) == (1, "deploying")
    assert registry.events(POOL, 2)[-1].message == "rolled back to version 1: reward collapsed"
    registry.mark_status(POOL, 1, "serving", "rollback done")
    assert (registry.current(POOL).version, registry.previous(POOL).version) == (1, 0)
    assert registry.get(POOL, 2).status == "retired"

    assert registry.register(POOL, checkpoints[2]).version == 3
    assert registry.rollback(POOL).version == 0  # a second rollback goes further back, not to version 2


def test_rollback_to_a_named_version_and_its_limits(registry, checkpoints):
    assert pytest.raises(RegistryError, registry.rollback, POOL).match("no earlier version")
    for checkpoint in checkpoints[:2]:
        deploy(registry, registry.register(POOL, checkpoint).version)
    never_served = registry.register(POOL, checkpoints[2]).version
    with pytest.raises(RegistryError, match="served before"):
        registry.rollback(POOL, to_version=never_served)
    assert registry.rollback(POOL, to_version=0).version == 0
    registry.mark_status(POOL, 0, "serving")
    assert (registry.current(POOL).version, registry.previous(POOL).version) == (0, 1)


def test_illegal_transitions_are_refused(registry, checkpoints):
    first, second = (registry.register(POOL, c).version for c in checkpoints[:2])
    with pytest.raises(RegistryError, match="cannot become serving"):
        registry.mark_status(POOL, first, "serving")
    with pytest.raises(RegistryError, match="unknown status"):
        registry.mark_status(POOL, first, "live")
    registry.mark_status(POOL, first, "deploying")
    with pytest.raises(RegistryError, match="is deploying"):
        registry.mark_status(POOL, second, "deploying")
    registry.mark_status(POOL, first, "serving")
    with pytest.raises(RegistryError, match="cannot become retired"):
        registry.mark_status(POOL, first, "retired")  # only a newer version's deploy retires the serving one


def test_a_trainer_may_choose_its_version_if_it_is_new(registry, checkpoints):
    assert registry.register(POOL, checkpoints[0], version=40).version == 40
    with pytest.raises(RegistryError, match="never reused"):
        registry.register(POOL, checkpoints[1], version=40)
    with pytest.raises(RegistryError, match="never reused"):
        registry.register(POOL, checkpoints[1], version=12)
    assert registry.register(POOL, checkpoints[1]).version == 41


def test_versions_are_64_bit_integers(registry, checkpoints):
    """A trainer numbering by tokens or timestamps passes 2**31 (PostgreSQL's INTEGER); the API allows 2**63 - 1."""
    step = 2**40
    assert registry.register(POOL, checkpoints[0], version=step).version == step
    deploy(registry, step)
    assert registry.register(POOL, checkpoints[1]).parent_version == step
    assert registry.highest_version(POOL) == step + 1


def test_an_unknown_pool_is_refused(registry, checkpoints):
    with pytest.raises(RegistryError, match="no base model"):
        registry.register("other-pool", checkpoints[0])
    assert registry.current("other-pool") is None
    with pytest.raises(RegistryError, match="no version 9"):
        registry.get(POOL, 9)


def test_the_registry_survives_a_restart(registry, database_url, checkpoints):
    version = registry.register(POOL, checkpoints[0]).version
    deploy(registry, version)
    registry.engine.dispose()

    reopened = CheckpointRegistry(create_engine(database_url))
    assert reopened.current(POOL).version == version
    assert [(v.version, v.status) for v in reopened.list()] == [(0, "retired"), (1, "serving")]
    assert [e.event for e in reopened.events(POOL)] == [
        "registered", "deploy_finished", "registered", "deploy_started", "retired", "deploy_finished"]


def test_adapters_serve_beside_the_weights_one_version_per_name(registry, checkpoints, tmp_path, base_dir):
    first = registry.register(POOL, write_lora_adapter(tmp_path / "a1", base_dir), name="coder").version
    deploy(registry, first)
    assert registry.current(POOL).version == 0  # an adapter does not replace the pool's weights
    weights = registry.register(POOL, checkpoints[0]).version
    deploy(registry, weights)
    assert [a.version for a in registry.serving_adapters(POOL)] == [first]  # nor do new weights unload it
    second = registry.register(POOL, write_lora_adapter(tmp_path / "a2", base_dir), name="coder").version
    other = registry.register(POOL, write_lora_adapter(tmp_path / "a3", base_dir), name="writer").version
    deploy(registry, second)
    deploy(registry, other)
    assert [a.version for a in registry.serving_adapters(POOL)] == [second, other]
    assert registry.get(POOL, first).status == "retired"
    assert registry.previous(POOL).version == 0  # the weights' history ignores adapters
    with pytest.raises(RegistryError, match="LoRA adapter"):
        registry.rollback(POOL, to_version=first)
    assert registry.unload_adapter(POOL, "writer").status == "retired"
    assert [a.name for a in registry.serving_adapters(POOL)] == ["coder"]
    with pytest.raises(RegistryError, match="no adapter named"):
        registry.unload_adapter(POOL, "writer")
