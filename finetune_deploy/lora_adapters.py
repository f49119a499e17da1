"""Checks a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) against a base model.

A LoRA on a linear layer W [out, in] adds B @ A with A [r, in] and B [out, r].
PEFT saves them as `base_model.model.<module>.lora_A.weight` / `.lora_B.weight`,
where <module> is the layer's name in the base model (its weight being
`<module>.weight`). So every adapter tensor can be checked against the base's
tensor table, with headers only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from finetune_deploy.checkpoint_files import (
    ADAPTER_WEIGHTS,
    CheckpointError,
    TensorInfo,
    Weights,
    load_json,
    read_weights,
)

ADAPTER_CONFIG = "adapter_config.json"
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
_LORA_TENSOR = re.compile(r"base_model\.model\.(?P<module>.+)\.lora_(?P<side>[AB])\.weight")


@dataclass(frozen=True)
class Adapter:
    rank: int
    target_modules: tuple[str, ...]
    weights: Weights


def check_adapter(directory: Path, base_tensors: dict[str, TensorInfo]) -> Adapter:
    config = load_json(directory / ADAPTER_CONFIG, "adapter_config")
    rank = _rank(config)
    targets = _target_modules(config)
    linear_layers = _linear_layers(base_tensors)
    for target in targets.patterns:
        if not any(targets.match(target, module) for module in linear_layers):
            raise CheckpointError(f"target module {target!r} matches no linear layer of the base model",
                                  "adapter_config.target_modules")
    weights = read_weights(directory, ADAPTER_WEIGHTS)
    pairs = _lora_pairs(weights.tensors)
    for module, (lora_a, lora_b) in sorted(pairs.items()):
        if module not in linear_layers:
            raise CheckpointError(f"adapter tensors target {module}, which is not a linear layer of the base model",
                                  "tensors")
        if not any(targets.match(target, module) for target in targets.patterns):
            raise CheckpointError(f"adapter has weights for {module}, which target_modules does not cover", "tensors")
        _check_pair_shapes(module, lora_a, lora_b, rank, linear_layers[module])
    for target in targets.patterns:
        if not any(targets.match(target, module) for module in pairs):
            raise CheckpointError(f"target module {target!r} has no adapter weights", "tensors")
    return Adapter(rank, targets.patterns, weights)


def _rank(config: dict) -> int:
    if config.get("peft_type", "LORA") != "LORA":
        raise CheckpointError(f"peft_type is {config['peft_type']!r}; only LORA adapters are served",
                              "adapter_config.peft_type")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        raise CheckpointError(f"LoRA rank r must be a positive integer, got {rank!r}", "adapter_config.r")
    if config.get("rank_pattern"):
        # Per-layer ranks would need PEFT's key matching to check shapes; refusing beats guessing.
        raise CheckpointError("rank_pattern (per-layer ranks) is not supported", "adapter_config.rank_pattern")
    return rank


@dataclass(frozen=True)
class TargetModules:
    """PEFT's rule: a list names modules by their last dotted parts; a single string is a full-match regex."""

    patterns: tuple[str, ...]
    is_regex: bool

    def match(self, pattern: str, module: str) -> bool:
        if self.is_regex:
            return re.fullmatch(pattern, module) is not None
        return module == pattern or module.endswith("." + pattern)


def _target_modules(config: dict) -> TargetModules:
    targets = config.get("target_modules")
    if isinstance(targets, str) and targets:
        try:
            re.compile(targets)
        except re.error as exc:
            raise CheckpointError(f"target_modules regex {targets!r} is invalid: {exc}",
                                  "adapter_config.target_modules") from None
        return TargetModules((targets,), is_regex=True)
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise CheckpointError(f"target_modules must be a non-empty list of module names or a regex, got {targets!r}",
                              "adapter_config.target_modules")
    return TargetModules(tuple(targets), is_regex=False)


def _linear_layers(base_tensors: dict[str, TensorInfo]) -> dict[str, TensorInfo]:
    """Module name -> its weight, for every 2-D `<module>.weight` of the base model."""
    return {name.removesuffix(".weight"): info for name, info in base_tensors.items()
            if name.endswith(".weight") and len(info.shape) == 2}


def _lora_pairs(tensors: dict[str, TensorInfo]) -> dict[str, tuple[TensorInfo, TensorInfo]]:
    sides: dict[str, dict[str, TensorInfo]] = {}
    for name, info in tensors.items():
        match = _LORA_TENSOR.fullmatch(name)
        if match is None:
            raise CheckpointError(f"adapter tensor {name} is not a LoRA weight "
                                  "(expected base_model.model.<module>.lora_A.weight / .lora_B.weight)", "tensors")
        if info.dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"adapter tensor {name} has dtype {info.dtype}, not a float type", "tensors")
        sides.setdefault(match["module"], {})[match["side"]] = info
    if not sides:
        raise CheckpointError(f"{ADAPTER_WEIGHTS} holds no tensors", "tensors")
    pairs = {}
    for module, found in sides.items():
        if set(found) != {"A", "B"}:
            missing = "lora_B" if "A" in found else "lora_A"
            raise CheckpointError(f"adapter for {module} has no {missing} weight", "tensors")
        pairs[module] = (found["A"], found["B"])
    return pairs


def _check_pair_shapes(module: str, lora_a: TensorInfo, lora_b: TensorInfo, rank: int, base: TensorInfo) -> None:
    out_features, in_features = base.shape
    expected = {"lora_A": (rank, in_features), "lora_B": (out_features, rank)}
    for side, info in (("lora_A", lora_a), ("lora_B", lora_b)):
        if info.shape != expected[side]:
            raise CheckpointError(f"{module}.{side} has shape {list(info.shape)}, expected {list(expected[side])} "
                                  f"(rank {rank}, base layer {list(base.shape)})", "tensors")
