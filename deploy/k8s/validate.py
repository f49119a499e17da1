"""Validate the manifests of deploy/k8s/ offline: every document against the vendored schema of its kind, then the
project's own deployment rules. Needs jsonschema and PyYAML (both already in .venv).

    .venv/bin/python deploy/k8s/validate.py [FILE.yaml ...]     # default: every deploy/k8s/*.yaml

Rules:
- a document's (apiVersion, kind) must have a vendored schema (SCHEMAS); an unknown kind is an error, not a skip;
- schemas are JSON Schema 2020-12 with `additionalProperties: false` ("strict"): an unknown field is an error, as
  with `kubectl apply --validate=strict`;
- the rules of `policy_errors` hold across the files: the security rules (docs/security.md), and every worker's
  probes run `rollout-serve worker-health` in its container.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

HERE = Path(__file__).resolve().parent
SCHEMA_DIR = HERE / "schemas"
KUBERNETES = SCHEMA_DIR / "kubernetes" / "v1.33.0-strict"
DYNAMO = SCHEMA_DIR / "dynamo"

# (apiVersion, kind) -> schema file
SCHEMAS: dict[tuple[str, str], Path] = {
    ("v1", "Namespace"): KUBERNETES / "namespace-v1.json",
    ("v1", "ServiceAccount"): KUBERNETES / "serviceaccount-v1.json",
    ("v1", "PersistentVolumeClaim"): KUBERNETES / "persistentvolumeclaim-v1.json",
    ("v1", "Service"): KUBERNETES / "service-v1.json",
    ("apps/v1", "Deployment"): KUBERNETES / "deployment-apps-v1.json",
    ("networking.k8s.io/v1", "NetworkPolicy"): KUBERNETES / "networkpolicy-networking-v1.json",
    ("nvidia.com/v1alpha1", "DynamoGraphDeployment"): DYNAMO / "dynamographdeployment-nvidia-v1alpha1.json",
}

# Environment variables that carry secrets: they must come from a Secret (valueFrom.secretKeyRef), never a value.
SECRET_ENV = ("ROLLOUT_SERVE_ADMIN_KEY", "ROLLOUT_SERVE_KV_SALT_SECRET", "ROLLOUT_SERVE_DATABASE_URL",
              "ROLLOUT_SERVE_WORKER_CONTROL_TOKEN")
FRONT_DOOR = {"app.kubernetes.io/name": "rollout-serve", "app.kubernetes.io/component": "front-door"}
CLIENT_PORT = 8000


def _registry() -> Registry:
    resources = []
    for path in sorted(KUBERNETES.glob("*.json")) + sorted(DYNAMO.glob("*.json")):
        contents = json.loads(path.read_text())
        resources.append((contents["$id"], Resource.from_contents(contents)))
    return Registry().with_resources(resources)


_REGISTRY = _registry()
_VALIDATORS: dict[Path, Draft202012Validator] = {}


def load_documents(path: Path) -> list[dict[str, Any]]:
    """The non-empty YAML documents of a file."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def schema_errors(doc: dict[str, Any]) -> list[str]:
    """What the vendored schema of the document's kind says against it (empty: valid)."""
    if not isinstance(doc, dict):
        return [f"not a mapping: {type(doc).__name__}"]
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key not in SCHEMAS:
        return [f"no vendored schema for apiVersion={key[0]!r} kind={key[1]!r}"]
    path = SCHEMAS[key]
    if path not in _VALIDATORS:
        _VALIDATORS[path] = Draft202012Validator(json.loads(path.read_text()), registry=_REGISTRY)
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in sorted(_VALIDATORS[path].iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]


def _containers(doc: dict[str, Any]) -> Iterable[tuple[str, dict[str, Any]]]:
    """(where, container) for every container a Deployment or a DynamoGraphDeployment describes."""
    if doc.get("kind") == "Deployment":
        pod = doc.get("spec", {}).get("template", {}).get("spec", {})
        for c in pod.get("containers", []) + pod.get("initContainers", []):
            yield f"Deployment/{doc['metadata']['name']}/{c.get('name')}", c
    elif doc.get("kind") == "DynamoGraphDeployment":
        for name, service in (doc.get("spec", {}).get("services") or {}).items():
            main = dict((service.get("extraPodSpec") or {}).get("mainContainer") or {})
            main["env"] = list(service.get("envs") or []) + list(main.get("env") or [])
            yield f"DynamoGraphDeployment/{doc['metadata']['name']}/{name}", main


def policy_errors(docs: list[dict[str, Any]]) -> list[str]:
    """The deployment's rules, over all documents together: security (docs/security.md), then the workers' probes."""
    errors = []
    for doc in docs:
        kind, name = doc.get("kind"), doc.get("metadata", {}).get("name")
        # Only the front door has a Service, and none leaves the cluster network: ClusterIP (an Ingress or a
        # LoadBalancer with TLS is the cluster's choice, in front of port 8000).
        if kind == "Service":
            spec = doc.get("spec", {})
            if spec.get("type", "ClusterIP") != "ClusterIP":
                errors.append(f"Service/{name}: type {spec.get('type')}, only ClusterIP is allowed")
            if spec.get("selector") != FRONT_DOOR:
                errors.append(f"Service/{name}: selects {spec.get('selector')}, only the front door may have one")
        for where, container in _containers(doc):
            args = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
            env = {e.get("name"): e for e in container.get("env") or []}
            # No open mode: not by flag, and ROLLOUT_SERVE_OPEN_MODE, where set, is false.
            if any(a == "--open-mode" or a.startswith("--open-mode=") for a in args):
                errors.append(f"{where}: --open-mode")
            if "ROLLOUT_SERVE_OPEN_MODE" in env and str(env["ROLLOUT_SERVE_OPEN_MODE"].get("value")).lower() != "false":
                errors.append(f"{where}: ROLLOUT_SERVE_OPEN_MODE must be false")
            # Secrets come from a Secret.
            for var in SECRET_ENV:
                if var in env and "secretKeyRef" not in (env[var].get("valueFrom") or {}):
                    errors.append(f"{where}: {var} must come from a Secret (valueFrom.secretKeyRef)")
            if any(a.startswith(("--admin-key", "--kv-salt-secret", "--database-url")) for a in args):
                errors.append(f"{where}: a secret on the command line")
            # Internal planes never bind an unspecified address.
            internal = [a.split("=", 1)[1] for a in args if a.startswith("--internal-host=")]
            internal += [str(env["ROLLOUT_SERVE_INTERNAL_HOST"].get("value"))] if "ROLLOUT_SERVE_INTERNAL_HOST" in env else []
            if any(host in ("0.0.0.0", "::", "[::]") for host in internal):
                errors.append(f"{where}: internal host is an unspecified address")
        # Every worker has its three probes, run in its container: the Dynamo operator's defaults are HTTP GETs
        # of the system port at the pod IP, and the worker's system port binds 127.0.0.1 (workers.yaml).
        if kind == "DynamoGraphDeployment":
            for where, container in _containers(doc):
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    command = ((container.get(probe) or {}).get("exec") or {}).get("command") or []
                    if command[:2] != ["rollout-serve", "worker-health"]:
                        errors.append(f"{where}: its {probe} must run `rollout-serve worker-health` in the container")
        # The front door: its admin key is set (from a Secret, above), so the service is never keyless.
        if kind == "Deployment" and doc.get("spec", {}).get("selector", {}).get("matchLabels") == FRONT_DOOR:
            for where, container in _containers(doc):
                names = {e.get("name") for e in container.get("env") or []}
                if "ROLLOUT_SERVE_ADMIN_KEY" not in names:
                    errors.append(f"{where}: no ROLLOUT_SERVE_ADMIN_KEY from a Secret")
    return errors


def validate_files(paths: list[Path]) -> list[str]:
    """Every error of the files: schema errors per document, then the policy over all of them."""
    errors, docs = [], []
    for path in paths:
        for i, doc in enumerate(load_documents(path)):
            docs.append(doc)
            errors += [f"{path.name}[{i}] {doc.get('kind') if isinstance(doc, dict) else '?'}: {e}"
                       for e in schema_errors(doc)]
    return errors + policy_errors([d for d in docs if isinstance(d, dict)])


def manifest_files() -> list[Path]:
    return sorted(HERE.glob("*.yaml"))


if __name__ == "__main__":
    files = [Path(p) for p in sys.argv[1:]] or manifest_files()
    problems = validate_files(files)
    for problem in problems:
        print(problem)
    print(f"{len(files)} files, {sum(len(load_documents(f)) for f in files)} documents, {len(problems)} errors")
    sys.exit(1 if problems else 0)
