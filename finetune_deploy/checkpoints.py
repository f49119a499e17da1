"""Validates a checkpoint directory against a pool's base model, before anything touches a worker.

A worker's update_weights_from_disk swaps tensors into a model built from the
base's config.json, and the front door keeps tokenizing with the base's
tokenizer. So a checkpoint is deployable only if it is finished writing, has the
base's architecture, the same tensor names, shapes and dtypes (or LoRA tensors
that fit the base's layers), and the same vocabulary. The first rule broken
raises CheckpointError naming it. See docs/deploy.md.

What was validated is what loads: `verify_unchanged` refuses, right before a
load, a checkpoint whose files are no longer the ones fingerprinted.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from finetune_deploy.checkpoint_files import (
    ADAPTER_WEIGHTS,
    INDEX_SUFFIX,
    MANIFEST,
    MODEL_WEIGHTS,
    TOKENIZER_FILES,
    CheckpointChanged,
    CheckpointError,
    FileState,
    TensorInfo,
    Weights,
    content_fingerprint,
    files_state,
    inside_directory,
    load_json,
    read_weights,
    require_declared_complete,
    tokenizer_files,
    verified_manifest_digests,
)
from finetune_deploy.lora_adapters import ADAPTER_CONFIG, check_adapter

__all__ = ["CheckpointError", "ValidatedCheckpoint", "detect_kind", "validate_checkpoint", "fingerprint_base_model",
           "verify_unchanged"]

MODEL_CONFIG = "config.json"
# Config keys the worker builds its model from; update_weights never re-reads them, so a change would be ignored.
STRUCTURE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings", "hidden_act")
MAX_NAMES_IN_MESSAGE = 5


@dataclass(frozen=True)
class ValidatedCheckpoint:
    path: Path
    kind: str                   # "full" | "lora"
    fingerprint: str            # sha256 over its weight, config and tokenizer files
    tensor_count: int
    lora_rank: int | None = None
    target_modules: tuple[str, ...] = ()
    files_state: dict[str, FileState] | None = None  # its content files when they were hashed (verify_unchanged)


@dataclass(frozen=True)
class _BaseModel:
    config: dict
    tensors: dict[str, TensorInfo]
    tokenizer: str | None


def detect_kind(path: Path) -> str:
    return "lora" if (Path(path) / ADAPTER_CONFIG).exists() else "full"


def validate_checkpoint(path: Path | str, base_dir: Path | str, kind: str | None = None) -> ValidatedCheckpoint:
    """Checks `path` against the base model in `base_dir`; `kind` ("full"|"lora") must match the files if given."""
    path, base_dir = Path(path), Path(base_dir)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a directory", "path")
    detected = detect_kind(path)
    if kind is not None and kind != detected:
        raise CheckpointError(f"{path} holds a {detected} checkpoint, not a {kind} one", "as")
    require_declared_complete(path)
    _require_own_files(path)
    base = _read_base_model(base_dir)
    if detected == "lora":
        adapter = check_adapter(path, base.tensors)
        weights, config_file, rank, targets = adapter.weights, ADAPTER_CONFIG, adapter.rank, adapter.target_modules
    else:
        weights, config_file, rank, targets = _check_full(path, base), MODEL_CONFIG, None, ()
    _check_tokenizer(path, base.tokenizer)
    content = _content_files(path, weights, config_file)
    state = files_state(path, content)  # before hashing: a write while they are hashed moves it
    fingerprint = content_fingerprint(path, content, verified_manifest_digests(path, content))
    _require_state(path, content, state)
    return ValidatedCheckpoint(path.resolve(), detected, fingerprint, len(weights.tensors), rank, targets, state)


def _require_own_files(path: Path) -> None:
    """The files the checks read by their well-known names are the directory's own, not symlinks out of it (shards
    and manifest entries are held to the same rule as they are listed)."""
    for name in (MODEL_CONFIG, ADAPTER_CONFIG, MODEL_WEIGHTS, ADAPTER_WEIGHTS, MODEL_WEIGHTS + INDEX_SUFFIX,
                 ADAPTER_WEIGHTS + INDEX_SUFFIX, MANIFEST, *TOKENIZER_FILES):
        if os.path.lexists(path / name):
            inside_directory(path, name, str(path), "files")


def verify_unchanged(path: Path | str, kind: str, fingerprint: str,
                     known_state: dict[str, FileState] | None = None) -> dict[str, FileState]:
    """Right before a load: refuses (CheckpointChanged) a checkpoint whose files are no longer the ones that gave
    `fingerprint`, or whose path now resolves elsewhere. Returns its files' state, for the next call's `known_state`.

    The fingerprint hashes every byte (seconds per GB of weights), so while each file's state (FileState: inode,
    size, mtime, ctime) is the one recorded when its content was last hashed, a stat of each file is the check;
    with no record (after a restart) or another state, the files are hashed again and must give `fingerprint`."""
    path = Path(path)
    weights_file, config_file = (ADAPTER_WEIGHTS, ADAPTER_CONFIG) if kind == "lora" else (MODEL_WEIGHTS, MODEL_CONFIG)
    try:
        if path.resolve() != path:
            raise CheckpointChanged(f"{path} now leads to {path.resolve()}", "path")
        content = _content_files(path, read_weights(path, weights_file), config_file)
        state = files_state(path, content)
        if state != known_state:
            if content_fingerprint(path, content, {}) != fingerprint:
                raise CheckpointChanged(f"the files of {path} are not the ones validated", "files")
            _require_state(path, content, state)
        return state
    except CheckpointChanged as exc:
        message = exc.message
    except (CheckpointError, OSError, RuntimeError) as exc:  # a file gone, a header rewritten, a symlink loop
        message = f"{path}: {getattr(exc, 'message', exc)}"
    raise CheckpointChanged(f"checkpoint changed since it was validated ({message}); it is not loaded: deploy "
                            "it again to validate what it holds now", "files")


def _require_state(path: Path, content: list[str], state: dict[str, FileState]) -> None:
    if files_state(path, content) != state:
        raise CheckpointChanged(f"the files of {path} changed while they were hashed", "files")


def fingerprint_base_model(base_dir: Path | str) -> str:
    """The same fingerprint as a checkpoint's, for the model a pool starts from (no completeness marker needed)."""
    base_dir = Path(base_dir)
    weights = read_weights(base_dir)
    return content_fingerprint(base_dir, _content_files(base_dir, weights, MODEL_CONFIG), {})


def _read_base_model(base_dir: Path) -> _BaseModel:
    if not base_dir.is_dir():
        raise CheckpointError(f"base model directory {base_dir} does not exist", "base_model")
    return _BaseModel(load_json(base_dir / MODEL_CONFIG, "base_model"), read_weights(base_dir).tensors,
                      _tokenizer_fingerprint(base_dir))


def _check_full(path: Path, base: _BaseModel) -> Weights:
    _check_config(load_json(path / MODEL_CONFIG, "config"), base.config)
    weights = read_weights(path)
    _check_tensors(weights.tensors, base.tensors)
    return weights


def _check_config(config: dict, base_config: dict) -> None:
    for key in ("architectures", "model_type"):
        if config.get(key) != base_config.get(key):
            raise CheckpointError(f"config.json {key} is {config.get(key)!r}; the base model's is "
                                  f"{base_config.get(key)!r}", f"config.{key}")
    for key in STRUCTURE_KEYS:
        if key in config and key in base_config and config[key] != base_config[key]:
            raise CheckpointError(f"config.json {key} is {config[key]!r}; the base model's is {base_config[key]!r}",
                                  f"config.{key}")


def _check_tensors(tensors: dict[str, TensorInfo], base_tensors: dict[str, TensorInfo]) -> None:
    unexpected = sorted(tensors.keys() - base_tensors.keys())
    if unexpected:
        raise CheckpointError(f"tensors the base model does not have: {_some(unexpected)}", "tensors")
    missing = sorted(base_tensors.keys() - tensors.keys())
    if missing:
        raise CheckpointError(f"tensors of the base model missing from the checkpoint: {_some(missing)}", "tensors")
    for name in sorted(tensors):
        mine, base = tensors[name], base_tensors[name]
        if (mine.shape, mine.dtype) != (base.shape, base.dtype):
            raise CheckpointError(f"tensor {name} is {mine.dtype} {list(mine.shape)}; the base model's is "
                                  f"{base.dtype} {list(base.shape)}", "tensors")


def _check_tokenizer(path: Path, base_tokenizer: str | None) -> None:
    mine = _tokenizer_fingerprint(path)
    if mine is None:
        return  # no vocabulary files: the checkpoint inherits the base's tokenizer
    if base_tokenizer is None:
        raise CheckpointError("the checkpoint ships a tokenizer but the base model has none to compare with",
                              "tokenizer")
    if mine.split(":")[0] != base_tokenizer.split(":")[0]:
        raise CheckpointError("the checkpoint's tokenizer files are of another format than the base model's "
                              "(tokenizer.json on one side only); ship the base's tokenizer files or none",
                              "tokenizer")
    if mine != base_tokenizer:
        raise CheckpointError("the checkpoint's tokenizer differs from the base model's (vocabulary, merges or "
                              "added tokens changed)", "tokenizer")


def _tokenizer_fingerprint(directory: Path) -> str | None:
    """Hash of what decides token ids: tokenizer.json's vocab, merges and added tokens, else the vocab files' bytes."""
    if (directory / "tokenizer.json").is_file():
        data = load_json(directory / "tokenizer.json", "tokenizer")
        model = data.get("model") or {}
        # tokenizers writes merges as "a b" strings or [a, b] pairs depending on its version.
        merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
        added = sorted((t.get("id"), t.get("content"), bool(t.get("special"))) for t in data.get("added_tokens") or [])
        canonical = json.dumps([model.get("type"), model.get("vocab"), merges, added], sort_keys=True)
        return "tokenizer.json:" + hashlib.sha256(canonical.encode()).hexdigest()
    vocab_files = [name for name in ("vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json")
                   if (directory / name).is_file()]
    if not vocab_files:
        return None
    digest = hashlib.sha256()
    for name in vocab_files:
        digest.update(name.encode() + b"\0" + (directory / name).read_bytes())
    return "vocab-files:" + digest.hexdigest()


def _content_files(directory: Path, weights: Weights, config_file: str) -> list[str]:
    """The files that decide what a worker serves: weights, shard index, config, tokenizer."""
    index = [weights.index] if weights.index else []
    return weights.files + index + [config_file] + tokenizer_files(directory)


def _some(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_NAMES_IN_MESSAGE])
    more = len(names) - MAX_NAMES_IN_MESSAGE
    return shown + (f" (and {more} more)" if more > 0 else "")
