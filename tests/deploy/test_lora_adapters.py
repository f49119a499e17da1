"""LoRA adapters: rank, target modules and A/B shapes must fit the base model's layers."""

import json

import pytest
import torch

from finetune_deploy.checkpoints import CheckpointError, validate_checkpoint
from rollout_server.harness.checkpoints import rewrite_adapter, write_lora_adapter, write_manifest

Q_PROJ = "base_model.model.model.layers.0.self_attn.q_proj"


def refusal(path, base_dir, kind=None) -> CheckpointError:
    with pytest.raises(CheckpointError) as caught:
        validate_checkpoint(path, base_dir, kind)
    return caught.value


@pytest.fixture
def adapter(tmp_path, base_dir):
    return write_lora_adapter(tmp_path / "adapter", base_dir, rank=8)


def test_an_adapter_on_q_and_v_projections_is_accepted(adapter, base_dir):
    checked = validate_checkpoint(adapter, base_dir, kind="lora")
    assert checked.kind == "lora" and checked.lora_rank == 8
    assert checked.target_modules == ("q_proj", "v_proj")
    assert checked.tensor_count == 4 * 2 * 2  # 4 layers, 2 modules, A and B


def test_an_adapter_is_detected_without_being_told(adapter, base_dir):
    assert validate_checkpoint(adapter, base_dir).kind == "lora"
    assert refusal(adapter, base_dir, kind="full").field == "as"


def test_an_adapter_still_being_written_is_refused(tmp_path, base_dir):
    unfinished = write_lora_adapter(tmp_path / "writing", base_dir, stable=False)
    assert refusal(unfinished, base_dir).field == "files"
    write_manifest(unfinished)
    assert validate_checkpoint(unfinished, base_dir).kind == "lora"


def test_a_regex_target_is_matched_against_module_paths(tmp_path, base_dir):
    adapter = write_lora_adapter(tmp_path / "regex", base_dir,
                                 config_changes={"target_modules": r".*\.self_attn\.(q_proj|v_proj)"})
    assert validate_checkpoint(adapter, base_dir).target_modules == (r".*\.self_attn\.(q_proj|v_proj)",)


@pytest.mark.parametrize("rank", [0, -4, "8", None])
def test_a_rank_that_is_not_a_positive_integer_is_refused(tmp_path, base_dir, rank):
    adapter = write_lora_adapter(tmp_path / "adapter", base_dir, config_changes={"r": rank})
    assert refusal(adapter, base_dir).field == "adapter_config.r"


def test_a_target_module_the_base_lacks_is_refused(tmp_path, base_dir):
    adapter = write_lora_adapter(tmp_path / "adapter", base_dir,
                                 config_changes={"target_modules": ["q_proj", "c_attn"]})
    error = refusal(adapter, base_dir)
    assert error.field == "adapter_config.target_modules" and "'c_attn'" in error.message


def test_a_lora_a_of_the_wrong_input_size_is_refused(adapter, base_dir):
    rewrite_adapter(adapter, lambda tensors: tensors.update({f"{Q_PROJ}.lora_A.weight": torch.zeros(8, 128)}))
    error = refusal(adapter, base_dir)
    assert error.field == "tensors" and "q_proj.lora_A" in error.message and "[8, 256]" in error.message


def test_a_lora_b_of_another_rank_is_refused(adapter, base_dir):
    rewrite_adapter(adapter, lambda tensors: tensors.update({f"{Q_PROJ}.lora_B.weight": torch.zeros(256, 4)}))
    error = refusal(adapter, base_dir)
    assert error.field == "tensors" and "q_proj.lora_B" in error.message and "[256, 8]" in error.message


def test_a_config_rank_that_disagrees_with_the_tensors_is_refused(tmp_path, base_dir):
    adapter = write_lora_adapter(tmp_path / "adapter", base_dir, rank=8, config_changes={"r": 16})
    assert refusal(adapter, base_dir).field == "tensors"


def test_an_unpaired_lora_a_is_refused(adapter, base_dir):
    rewrite_adapter(adapter, lambda tensors: tensors.pop(f"{Q_PROJ}.lora_B.weight"))
    error = refusal(adapter, base_dir)
    assert error.field == "tensors" and "no lora_B" in error.message


def test_weights_for_a_module_outside_target_modules_are_refused(tmp_path, base_dir):
    adapter = write_lora_adapter(tmp_path / "adapter", base_dir, config_changes={"target_modules": ["q_proj"]})
    error = refusal(adapter, base_dir)
    assert error.field == "tensors" and "v_proj" in error.message and "target_modules" in error.message


def test_a_target_without_weights_is_refused(tmp_path, base_dir):
    adapter = write_lora_adapter(tmp_path / "adapter", base_dir, targets=("q_proj",),
                                 config_changes={"target_modules": ["q_proj", "k_proj"]})
    error = refusal(adapter, base_dir)
    assert error.field == "tensors" and "'k_proj' has no adapter weights" in error.message


def test_a_tensor_that_is_not_a_lora_weight_is_refused(adapter, base_dir):
    rewrite_adapter(adapter, lambda tensors: tensors.update(
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector": torch.ones(256)}))
    error = refusal(adapter, base_dir)
    assert error.field == "tensors" and "lora_magnitude_vector" in error.message


def test_a_non_lora_peft_adapter_is_refused(tmp_path, base_dir):
    adapter = write_lora_adapter(tmp_path / "adapter", base_dir, config_changes={"peft_type": "IA3"})
    assert refusal(adapter, base_dir).field == "adapter_config.peft_type"


def test_an_adapter_shipping_another_tokenizer_is_refused(adapter, base_dir):
    tokenizer = json.loads((base_dir / "tokenizer.json").read_text())
    first = next(iter(tokenizer["model"]["vocab"]))
    tokenizer["model"]["vocab"][first + "x"] = tokenizer["model"]["vocab"].pop(first)
    (adapter / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert refusal(adapter, base_dir).field == "tokenizer"


def test_an_adapter_shipping_the_base_tokenizer_is_accepted(adapter, base_dir):
    (adapter / "tokenizer.json").write_bytes((base_dir / "tokenizer.json").read_bytes())
    assert validate_checkpoint(adapter, base_dir).kind == "lora"
