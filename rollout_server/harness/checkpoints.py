"""Builds checkpoint directories for the tests: copies of real ones, and broken variants of them."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

WEIGHTS = "model.safetensors"


def copy_checkpoint(source: Path, target: Path, stable: bool = True) -> Path:
    shutil.copytree(source, target)
    if stable:
        (target / "STABLE").touch()
    return target


def rewrite_weights(directory: Path, change) -> None:
    """Loads model.safetensors, lets `change(tensors)` edit the dict, writes it back."""
    tensors = load_file(directory / WEIGHTS)
    change(tensors)
    save_file(tensors, directory / WEIGHTS, metadata={"format": "pt"})


def shard_weights(directory: Path, shards: int = 2) -> list[str]:
    """Splits model.safetensors into `shards` files plus model.safetensors.index.json, as HF does."""
    tensors = load_file(directory / WEIGHTS)
    names = sorted(tensors)
    files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    weight_map = {}
    for i, file in enumerate(files):
        part = names[i::shards]
        save_file({name: tensors[name] for name in part}, directory / file, metadata={"format": "pt"})
        weight_map.update({name: file for name in part})
    (directory / WEIGHTS).unlink()
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return files


def write_manifest(directory: Path, files: list[str] | None = None) -> dict[str, str]:
    files = files or sorted(p.name for p in directory.iterdir() if p.is_file() and p.name != "STABLE")
    digests = {name: hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in files}
    (directory / "manifest.json").write_text(json.dumps({"files": digests}))
    return digests


def base_shapes(base_dir: Path) -> dict[str, list[int]]:
    with safe_open(base_dir / WEIGHTS, framework="pt") as f:
        return {name: f.get_slice(name).get_shape() for name in f.keys()}


def write_lora_adapter(directory: Path, base_dir: Path, rank: int = 8, targets=("q_proj", "v_proj"),
                       stable: bool = True, config_changes: dict | None = None) -> Path:
    """A PEFT-format adapter: lora_A [r, in] and lora_B [out, r] for every targeted linear layer of the base."""
    directory.mkdir(parents=True)
    tensors = {}
    for name, (out_features, in_features) in _linear_weights(base_dir).items():
        module = name.removesuffix(".weight")
        if module.rsplit(".", 1)[-1] in targets:
            tensors[f"base_model.model.{module}.lora_A.weight"] = torch.randn(rank, in_features) * 0.01
            tensors[f"base_model.model.{module}.lora_B.weight"] = torch.zeros(out_features, rank)
    save_file(tensors, directory / "adapter_model.safetensors", metadata={"format": "pt"})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base_dir),
              "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0, "target_modules": list(targets),
              "bias": "none", "rank_pattern": {}, "alpha_pattern": {}}
    config.update(config_changes or {})
    (directory / "adapter_config.json").write_text(json.dumps(config))
    if stable:
        (directory / "STABLE").touch()
    return directory


def _linear_weights(base_dir: Path) -> dict[str, list[int]]:
    return {name: shape for name, shape in base_shapes(base_dir).items()
            if name.endswith(".weight") and len(shape) == 2}


def rewrite_adapter(directory: Path, change) -> None:
    tensors = load_file(directory / "adapter_model.safetensors")
    change(tensors)
    save_file(tensors, directory / "adapter_model.safetensors", metadata={"format": "pt"})
