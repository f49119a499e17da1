"""Full-weight checkpoints: accepted when they fit the base model, refused naming the first rule they break."""

import json

import pytest
import torch

from finetune_deploy.checkpoints import CheckpointError, fingerprint_base_model, validate_checkpoint
from rollout_server.harness.checkpoints import copy_checkpoint, rewrite_weights, shard_weights, write_manifest

Q_PROJ = "model.layers.0.self_attn.q_proj.weight"


def refusal(path, base_dir, kind=None) -> CheckpointError:
    with pytest.raises(CheckpointError) as caught:
        validate_checkpoint(path, base_dir, kind)
    return caught.value


@pytest.fixture
def checkpoint(tmp_path, finetuned_dir):
    return copy_checkpoint(finetuned_dir, tmp_path / "step-100")


def test_a_finished_finetune_of_the_base_is_accepted(checkpoint, base_dir):
    checked = validate_checkpoint(checkpoint, base_dir)
    assert checked.kind == "full" and checked.path == checkpoint.resolve()
    assert checked.tensor_count == 4 * 12 + 2  # 12 tensors per layer, embedding and final norm (lm_head tied)
    assert len(checked.fingerprint) == 64
    assert checked.fingerprint != fingerprint_base_model(base_dir)
    assert validate_checkpoint(checkpoint, base_dir, kind="full").fingerprint == checked.fingerprint


def test_the_fingerprint_follows_the_content_not_the_location(checkpoint, base_dir, tmp_path):
    moved = copy_checkpoint(checkpoint, tmp_path / "elsewhere", stable=False)
    assert validate_checkpoint(moved, base_dir).fingerprint == validate_checkpoint(checkpoint, base_dir).fingerprint
    rewrite_weights(moved, lambda tensors: tensors[Q_PROJ].mul_(2))
    assert validate_checkpoint(moved, base_dir).fingerprint != validate_checkpoint(checkpoint, base_dir).fingerprint


def test_a_directory_still_being_written_is_refused(tmp_path, finetuned_dir, base_dir):
    unfinished = copy_checkpoint(finetuned_dir, tmp_path / "writing", stable=False)
    error = refusal(unfinished, base_dir)
    assert error.field == "files" and "STABLE" in error.message and "manifest.json" in error.message


def test_a_manifest_with_matching_checksums_replaces_the_marker(tmp_path, finetuned_dir, base_dir):
    checkpoint = copy_checkpoint(finetuned_dir, tmp_path / "ckpt", stable=False)
    write_manifest(checkpoint)
    assert validate_checkpoint(checkpoint, base_dir).kind == "full"


def test_a_checksum_mismatch_is_refused_naming_the_file(tmp_path, finetuned_dir, base_dir):
    checkpoint = copy_checkpoint(finetuned_dir, tmp_path / "ckpt", stable=False)
    digests = write_manifest(checkpoint)
    digests["tokenizer.json"] = "0" * 64
    (checkpoint / "manifest.json").write_text(json.dumps({"files": digests}))
    error = refusal(checkpoint, base_dir)
    assert error.field == "manifest" and "tokenizer.json" in error.message and "sha256" in error.message


def test_a_manifest_checked_even_with_the_marker(checkpoint, base_dir):
    write_manifest(checkpoint)
    rewrite_weights(checkpoint, lambda tensors: tensors[Q_PROJ].add_(1))  # changed after the manifest was written
    error = refusal(checkpoint, base_dir)
    assert error.field == "manifest" and "model.safetensors" in error.message


def test_a_manifest_must_cover_the_weights(tmp_path, finetuned_dir, base_dir):
    checkpoint = copy_checkpoint(finetuned_dir, tmp_path / "ckpt", stable=False)
    write_manifest(checkpoint, files=["config.json"])
    error = refusal(checkpoint, base_dir)
    assert error.field == "manifest" and "does not list" in error.message and "model.safetensors" in error.message


def test_a_manifest_pointing_outside_the_directory_is_refused(checkpoint, base_dir):
    (checkpoint / "manifest.json").write_text(json.dumps({"files": {"../secret": "a" * 64}}))
    assert refusal(checkpoint, base_dir).field == "manifest"


def test_a_truncated_weight_file_is_refused_even_when_marked_stable(checkpoint, base_dir):
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    error = refusal(checkpoint, base_dir)
    assert error.field == "files" and "truncated" in error.message


def test_a_tensor_of_the_wrong_shape_is_refused_by_name(checkpoint, base_dir):
    rewrite_weights(checkpoint, lambda tensors: tensors.update({Q_PROJ: torch.zeros(128, 256)}))
    error = refusal(checkpoint, base_dir)
    assert error.field == "tensors" and Q_PROJ in error.message and "[128, 256]" in error.message


def test_a_tensor_of_another_dtype_is_refused(checkpoint, base_dir):
    rewrite_weights(checkpoint, lambda tensors: tensors.update({Q_PROJ: tensors[Q_PROJ].to(torch.bfloat16)}))
    error = refusal(checkpoint, base_dir)
    assert error.field == "tensors" and "BF16" in error.message and "F32" in error.message


def test_missing_and_unknown_tensors_are_refused(tmp_path, finetuned_dir, base_dir):
    missing = copy_checkpoint(finetuned_dir, tmp_path / "missing")
    rewrite_weights(missing, lambda tensors: tensors.pop("model.norm.weight"))
    error = refusal(missing, base_dir)
    assert error.field == "tensors" and "missing" in error.message and "model.norm.weight" in error.message

    extra = copy_checkpoint(finetuned_dir, tmp_path / "extra")
    embedding = "model.embed_tokens.weight"
    rewrite_weights(extra, lambda tensors: tensors.update({"lm_head.weight": tensors[embedding].clone()}))
    error = refusal(extra, base_dir)
    assert error.field == "tensors" and "lm_head.weight" in error.message


@pytest.mark.parametrize("key, value", [("architectures", ["LlamaForCausalLM"]), ("model_type", "llama"),
                                        ("num_attention_heads", 8)])
def test_another_architecture_is_refused(checkpoint, base_dir, key, value):
    config = json.loads((checkpoint / "config.json").read_text())
    config[key] = value
    (checkpoint / "config.json").write_text(json.dumps(config))
    error = refusal(checkpoint, base_dir)
    assert error.field == f"config.{key}" and repr(value) in error.message


def test_a_sharded_checkpoint_is_read_through_its_index(checkpoint, base_dir):
    shard_weights(checkpoint, shards=3)
    assert validate_checkpoint(checkpoint, base_dir).tensor_count == 50


def test_a_missing_shard_is_refused(checkpoint, base_dir):
    shards = shard_weights(checkpoint, shards=2)
    (checkpoint / shards[1]).unlink()
    error = refusal(checkpoint, base_dir)
    assert error.field == "files" and "missing" in error.message and shards[1] in error.message


def test_an_index_that_misplaces_a_tensor_is_refused(checkpoint, base_dir):
    shards = shard_weights(checkpoint, shards=2)
    index_file = checkpoint / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    index["weight_map"][Q_PROJ] = shards[0] if index["weight_map"][Q_PROJ] == shards[1] else shards[1]
    index_file.write_text(json.dumps(index))
    error = refusal(checkpoint, base_dir)
    assert error.field == "files" and Q_PROJ in error.message


def test_a_changed_vocabulary_is_refused(checkpoint, base_dir):
    tokenizer = json.loads((checkpoint / "tokenizer.json").read_text())
    tokenizer["added_tokens"].append({"id": 4200, "content": "<think>", "single_word": False, "lstrip": False,
                                      "rstrip": False, "normalized": False, "special": False})
    (checkpoint / "tokenizer.json").write_text(json.dumps(tokenizer))
    error = refusal(checkpoint, base_dir)
    assert error.field == "tokenizer" and "differs" in error.message


def test_a_reformatted_but_identical_tokenizer_is_accepted(checkpoint, base_dir):
    tokenizer = json.loads((checkpoint / "tokenizer.json").read_text())
    tokenizer["model"]["merges"] = [" ".join(pair) for pair in tokenizer["model"]["merges"]]  # older tokenizers' format
    (checkpoint / "tokenizer.json").write_text(json.dumps(tokenizer, indent=1))
    assert validate_checkpoint(checkpoint, base_dir).kind == "full"


def test_a_checkpoint_without_tokenizer_files_inherits_the_base_tokenizer(checkpoint, base_dir):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (checkpoint / name).unlink()
    assert validate_checkpoint(checkpoint, base_dir).kind == "full"


def test_a_path_that_is_not_a_directory_or_the_wrong_kind_is_refused(checkpoint, base_dir, tmp_path):
    assert refusal(tmp_path / "nowhere", base_dir).field == "path"
    error = refusal(checkpoint, base_dir, kind="lora")
    assert error.field == "as" and "full" in error.message


def test_a_checkpoint_without_weights_is_refused(checkpoint, base_dir):
    (checkpoint / "model.safetensors").unlink()
    error = refusal(checkpoint, base_dir)
    assert error.field == "files" and "no safetensors weights" in error.message


def test_a_file_that_is_not_safetensors_is_refused(checkpoint, base_dir):
    (checkpoint / "model.safetensors").write_bytes(b"PK\x03\x04 a zip, not safetensors")
    error = refusal(checkpoint, base_dir)
    assert error.field == "files" and "not a complete safetensors file" in error.message
