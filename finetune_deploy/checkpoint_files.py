"""The files of a checkpoint directory: safetensors headers, shards, completeness, fingerprint.

Weights are never loaded. A safetensors file starts with an 8-byte little-endian
header length, then a JSON table {tensor name: {dtype, shape, data_offsets}};
that table is all we read. A directory still being written is refused unless
its writer declared it finished, with a `STABLE` marker or a `manifest.json` of
sha256 checksums (which are then all verified).

Paths are an admin's input, so they are held to rules (UnsafeCheckpointPath when
broken): a checkpoint lies under a configured root once its symlinks are resolved
(`resolve_under_roots`), and every file name a checkpoint lists or serves (a
manifest's, a shard index's, the content files) stays inside its directory, as
written and once resolved (`inside_directory`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

STABLE_MARKER = "STABLE"
MANIFEST = "manifest.json"
MODEL_WEIGHTS = "model.safetensors"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
INDEX_SUFFIX = ".index.json"  # a sharded checkpoint's <weights file>.index.json names its shards
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json")
MAX_HEADER_BYTES = 100 * 2**20  # real headers are a few MB; more means a corrupt length


class CheckpointError(Exception):
    """A checkpoint that must not reach a worker. `field` names what is wrong (e.g. "tensors", "tokenizer")."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.message = message
        self.field = field


class UnsafeCheckpointPath(CheckpointError):
    """A path that leads where checkpoints may not be read from: outside every root, or out of its directory."""


class CheckpointChanged(CheckpointError):
    """A checkpoint whose files are no longer the ones validated and fingerprinted: it must not be loaded."""


# One file's identity and last change, from stat: (device, inode, size, mtime_ns, ctime_ns). Writing a file moves
# its mtime and ctime, replacing it moves its inode, and no user can set ctime back: equal states mean the
# content hashed with them is unchanged, for the price of a stat instead of reading the file again.
FileState = tuple[int, int, int, int, int]


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: str  # safetensors spelling: "F32", "BF16", ...
    file: str   # the file (shard) holding it, relative to the checkpoint directory


@dataclass(frozen=True)
class Weights:
    files: list[str]               # weight files, relative to the directory
    index: str | None              # the shard index file, when sharded
    tensors: dict[str, TensorInfo]


def load_json(path: Path, field: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path.name} is missing from {path.parent}", field) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}", field) from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object", field)
    return data


def read_safetensors_header(path: Path, relative_name: str) -> dict[str, TensorInfo]:
    """The tensor table of one safetensors file; refuses a truncated or corrupt file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        header_length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if not 0 < header_length <= min(MAX_HEADER_BYTES, size - 8):
            raise CheckpointError(f"{relative_name} is not a complete safetensors file (bad header length)", "files")
        raw_header = f.read(header_length)
    data_bytes = size - 8 - header_length
    try:
        entries = {name: (tuple(entry["shape"]), entry["dtype"], entry["data_offsets"][1])
                   for name, entry in json.loads(raw_header).items() if name != "__metadata__"}
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{relative_name} has a corrupt safetensors header ({type(exc).__name__})",
                              "files") from None
    for name, (_, _, end) in entries.items():
        if end > data_bytes:
            raise CheckpointError(f"{relative_name} is truncated: tensor {name} ends at byte {end} "
                                  f"of a {data_bytes}-byte data section", "files")
    return {name: TensorInfo(shape, dtype, relative_name) for name, (shape, dtype, _) in entries.items()}


def read_weights(directory: Path, single_file: str = MODEL_WEIGHTS) -> Weights:
    """The tensors of a checkpoint: one `single_file`, or the shards its `<single_file>.index.json` names."""
    index_name = single_file + INDEX_SUFFIX
    if (directory / index_name).exists():
        return _read_sharded(directory, index_name)
    if (directory / single_file).is_file():
        return Weights([single_file], None, read_safetensors_header(directory / single_file, single_file))
    raise CheckpointError(f"{directory} has no safetensors weights ({single_file} or {index_name})", "files")


def _read_sharded(directory: Path, index_name: str) -> Weights:
    weight_map = load_json(directory / index_name, "files").get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index_name} has no weight_map", "files")
    weight_map = {name: inside_directory(directory, shard, index_name, "files") for name, shard in weight_map.items()}
    shards = sorted(set(weight_map.values()))
    missing = [shard for shard in shards if not (directory / shard).is_file()]
    if missing:
        raise CheckpointError(f"shards listed in {index_name} are missing: {', '.join(missing)}", "files")
    tensors: dict[str, TensorInfo] = {}
    for shard in shards:
        for name, info in read_safetensors_header(directory / shard, shard).items():
            if name in tensors:
                raise CheckpointError(f"tensor {name} is stored twice ({tensors[name].file} and {shard})", "tensors")
            tensors[name] = info
    for name, shard in weight_map.items():
        if name not in tensors or tensors[name].file != shard:
            raise CheckpointError(f"{index_name} places tensor {name} in {shard}, which does not hold it", "files")
    return Weights(shards, index_name, tensors)


def require_declared_complete(directory: Path) -> None:
    """A writer declares a checkpoint finished with a STABLE marker or a manifest.json."""
    if not (directory / STABLE_MARKER).exists() and not (directory / MANIFEST).exists():
        raise CheckpointError(f"{directory} may still be being written: it has neither a {STABLE_MARKER} marker "
                              f"file nor a {MANIFEST} with sha256 checksums", "files")


def verified_manifest_digests(directory: Path, content_files: list[str]) -> dict[str, str]:
    """Checks every checksum in manifest.json and that it covers `content_files`; {} without a manifest."""
    if not (directory / MANIFEST).exists():
        return {}
    listed = _manifest_entries(directory)
    uncovered = [name for name in content_files if name not in listed]
    if uncovered:
        raise CheckpointError(f"{MANIFEST} does not list {', '.join(uncovered)}", "manifest")
    for name, expected in sorted(listed.items()):
        file = directory / name
        if not file.is_file():
            raise CheckpointError(f"{MANIFEST} lists {name}, which is missing", "manifest")
        if sha256_file(file) != expected:
            raise CheckpointError(f"{name} does not match its sha256 in {MANIFEST}", "manifest")
    return listed


def _manifest_entries(directory: Path) -> dict[str, str]:
    files = load_json(directory / MANIFEST, "manifest").get("files")
    if not isinstance(files, dict) or not files:
        raise CheckpointError(f'{MANIFEST} must hold {{"files": {{"<relative path>": "<sha256 hex>"}}}}', "manifest")
    entries = {}
    for name, digest in files.items():
        relative = inside_directory(directory, name, MANIFEST, "manifest")
        if not isinstance(digest, str) or len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest.lower()):
            raise CheckpointError(f"{MANIFEST} gives {name} a checksum that is not a sha256 hex digest", "manifest")
        entries[relative] = digest.lower()
    return entries


def inside_directory(directory: Path, name: object, listed_by: str, field: str) -> str:
    """`name`, a file a checkpoint lists (in `listed_by`), normalised, if it stays inside `directory`: relative,
    no `..`, and no symlink on the way that leads out. Else UnsafeCheckpointPath naming it: a checkpoint must not
    make the server read, hash or load a file of somewhere else."""
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"{listed_by} lists {name!r}, which is not a file name", field)
    relative = PurePosixPath(name)
    if relative.is_absolute() or ".." in relative.parts:
        raise UnsafeCheckpointPath(f"{name!r} (in {listed_by}) is outside the checkpoint directory", field)
    if not _resolved(directory / relative).is_relative_to(_resolved(directory)):
        raise UnsafeCheckpointPath(f"{name!r} (in {listed_by}) is a symlink that leads outside the checkpoint "
                                   "directory", field)
    return str(relative)


def resolve_under_roots(path: Path, roots: list[Path], field: str = "path") -> Path:
    """`path` with its symlinks resolved, if that lies under one of `roots` (resolved too); else
    UnsafeCheckpointPath listing the roots. The caller goes on with the resolved path, so a symlink changed after
    this check cannot send it elsewhere."""
    resolved, allowed = _resolved(path, field), [_resolved(root) for root in roots]
    if not any(resolved.is_relative_to(root) for root in allowed):
        where = ", ".join(str(root) for root in allowed) or "none configured"
        raise UnsafeCheckpointPath(f"{path} is not under a directory checkpoints are deployed from ({where}); "
                                   "add its directory to deploy.checkpoint_roots", field)
    return resolved


def _resolved(path: Path, field: str = "path") -> Path:
    try:
        return path.resolve()
    except RuntimeError:  # a symlink loop
        raise UnsafeCheckpointPath(f"{path} is a symlink loop", field) from None
    except ValueError:  # a NUL byte: no file has such a name
        raise UnsafeCheckpointPath(f"{str(path)!r} holds a NUL byte, which no path can", field) from None


def files_state(directory: Path, names: list[str]) -> dict[str, FileState]:
    """Each file's FileState; a missing file raises FileNotFoundError."""
    states = {}
    for name in sorted(names):
        stat = (directory / name).stat()
        states[name] = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    return states


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def tokenizer_files(directory: Path) -> list[str]:
    return [name for name in TOKENIZER_FILES if (directory / name).is_file()]


def content_fingerprint(directory: Path, content_files: list[str], known_digests: dict[str, str]) -> str:
    """sha256 over the sorted (file, sha256) pairs; digests already verified from a manifest are reused."""
    lines = []
    for name in sorted(content_files):
        digest = known_digests.get(name) or sha256_file(directory / name)
        lines.append(f"{name} {digest}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()
