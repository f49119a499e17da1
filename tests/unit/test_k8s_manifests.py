"""deploy/k8s/: every manifest validates offline against the vendored schema of its kind, and broken copies do not.

The validator is deploy/k8s/validate.py (the same one `python deploy/k8s/validate.py` runs). Each negative test
breaks one thing in a copy of a real manifest and expects the validator to name it: a validator that accepted
everything would fail here.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("k8s_validate", ROOT / "deploy" / "k8s" / "validate.py")
validate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(validate)

MANIFESTS = validate.manifest_files()


def _docs() -> list[dict]:
    return [doc for path in MANIFESTS for doc in validate.load_documents(path)]


def _one(kind: str, name: str | None = None) -> dict:
    """A deep copy of the manifest document of that kind (and name)."""
    found = [d for d in _docs() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, len(found))
    return copy.deepcopy(found[0])


def _front_door_container(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]["containers"][0]


# --- the manifests as written -------------------------------------------------------------------------------

@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_matches_its_schema(path):
    docs = validate.load_documents(path)
    assert docs, f"{path.name} has no document"
    for doc in docs:
        assert validate.schema_errors(doc) == [], (path.name, doc["kind"], doc["metadata"]["name"])


def test_all_manifests_pass_schema_and_policy():
    assert validate.validate_files(MANIFESTS) == []


def test_the_deployment_has_its_parts():
    kinds = {(d["kind"], d["metadata"]["name"]) for d in _docs()}
    assert {("Deployment", "rollout-serve-front-door"), ("Service", "rollout-serve"),
            ("DynamoGraphDeployment", "rollout-serve-workers"), ("NetworkPolicy", "default-deny-ingress")} <= kinds
    dgd = _one("DynamoGraphDeployment")
    assert dgd["spec"]["backendFramework"] == "vllm"
    assert {s["subComponentType"] for s in dgd["spec"]["services"].values()} == {"prefill", "decode"}


def test_every_vendored_reference_resolves():
    """The pruned _definitions.json is closed: every $ref of every vendored schema resolves."""
    def refs(node, base):
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                yield base, node["$ref"]
            for value in node.values():
                yield from refs(value, base)
        elif isinstance(node, list):
            for value in node:
                yield from refs(value, base)

    count = 0
    for path in sorted(validate.KUBERNETES.glob("*.json")) + sorted(validate.DYNAMO.glob("*.json")):
        contents = json.loads(path.read_text())
        resolver = validate._REGISTRY.resolver(base_uri=contents["$id"])
        for _, ref in refs(contents, contents["$id"]):
            resolver.lookup(ref)   # raises Unresolvable when a definition is missing
            count += 1
    assert count > 100


def test_dynamo_schema_accepts_dynamo_1_6_own_manifests():
    """The DynamoGraphDeployment schema is transcribed by hand (schemas/README.md): it must accept the v1alpha1
    manifests that ship inside the installed ai-dynamo wheel, written for the operator's real CRD."""
    dynamo_spec = importlib.util.find_spec("dynamo")  # a dependency of the project: scripts/bootstrap installs it
    assert dynamo_spec is not None and dynamo_spec.submodule_search_locations, "ai-dynamo is not installed"
    root = Path(next(iter(dynamo_spec.submodule_search_locations)))
    checked = 0
    for path in sorted(root.rglob("*.yaml")):
        try:
            docs = validate.load_documents(path)
        except yaml.YAMLError:  # templates with placeholders are not YAML
            continue
        for doc in docs:
            if isinstance(doc, dict) and doc.get("kind") == "DynamoGraphDeployment" \
                    and doc.get("apiVersion") == "nvidia.com/v1alpha1":
                assert validate.schema_errors(doc) == [], path
                checked += 1
    assert checked > 0, "the installed ai-dynamo ships no v1alpha1 DynamoGraphDeployment: nothing checked the schema"


# --- broken copies: the schemas reject them ------------------------------------------------------------------

def _assert_rejected(doc: dict, fragment: str):
    errors = validate.schema_errors(doc)
    assert errors, "a broken manifest was accepted"
    assert any(fragment in e for e in errors), errors


def test_wrong_type_is_rejected():
    deployment = _one("Deployment")
    deployment["spec"]["replicas"] = "1"
    _assert_rejected(deployment, "spec/replicas")


def test_missing_required_field_is_rejected():
    deployment = _one("Deployment")
    del deployment["spec"]["selector"]
    _assert_rejected(deployment, "'selector' is a required property")


def test_unknown_field_is_rejected():
    service = _one("Service", "rollout-serve")
    service["spec"]["ports"][0]["targetPorts"] = "http"   # a typo of targetPort
    _assert_rejected(service, "targetPorts")


def test_service_port_must_be_a_number():
    service = _one("Service", "rollout-serve")
    service["spec"]["ports"][0]["port"] = "8000"
    _assert_rejected(service, "spec/ports/0/port")


def test_unknown_kind_is_rejected():
    _assert_rejected({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}, "no vendored schema")


def test_dynamo_backend_outside_its_enum_is_rejected():
    dgd = _one("DynamoGraphDeployment")
    dgd["spec"]["backendFramework"] = "vllm-cpu"
    _assert_rejected(dgd, "spec/backendFramework")


def test_dynamo_negative_replicas_are_rejected():
    dgd = _one("DynamoGraphDeployment")
    dgd["spec"]["services"]["decode"]["replicas"] = -1
    _assert_rejected(dgd, "spec/services/decode/replicas")


def test_dynamo_main_container_is_checked_as_a_kubernetes_container():
    dgd = _one("DynamoGraphDeployment")
    dgd["spec"]["services"]["prefill"]["extraPodSpec"]["mainContainer"]["image"] = 5
    _assert_rejected(dgd, "mainContainer/image")
    dgd = _one("DynamoGraphDeployment")
    dgd["spec"]["services"]["prefill"]["extraPodSpec"]["mainContainer"]["ports"][0]["containerPort"] = "19080"
    _assert_rejected(dgd, "mainContainer/ports/0/containerPort")


def test_dynamo_unknown_service_field_is_rejected():
    dgd = _one("DynamoGraphDeployment")
    dgd["spec"]["services"]["prefill"]["replica"] = 1
    _assert_rejected(dgd, "replica")


# --- broken copies: the security policy rejects them ---------------------------------------------------------

def _policy(docs: list[dict]) -> list[str]:
    return validate.policy_errors(docs)


def test_a_service_outside_the_cluster_network_is_rejected():
    service = _one("Service", "rollout-serve")
    service["spec"]["type"] = "LoadBalancer"
    assert validate.schema_errors(service) == []          # valid Kubernetes, so only the policy can catch it
    assert any("only ClusterIP" in e for e in _policy([service]))


def test_a_service_for_the_workers_is_rejected():
    service = _one("Service", "rollout-serve-internal")
    service["spec"]["selector"] = {"app.kubernetes.io/name": "rollout-serve", "app.kubernetes.io/component": "worker"}
    assert any("only the front door" in e for e in _policy([service]))


def test_open_mode_is_rejected():
    deployment = _one("Deployment")
    _front_door_container(deployment)["args"].append("--open-mode")
    assert any("--open-mode" in e for e in _policy([deployment]))
    deployment = _one("Deployment")
    for var in _front_door_container(deployment)["env"]:
        if var["name"] == "ROLLOUT_SERVE_OPEN_MODE":
            var["value"] = "true"
    assert any("OPEN_MODE must be false" in e for e in _policy([deployment]))


def test_an_admin_key_not_from_a_secret_is_rejected():
    deployment = _one("Deployment")
    for var in _front_door_container(deployment)["env"]:
        if var["name"] == "ROLLOUT_SERVE_ADMIN_KEY":
            var.pop("valueFrom")
            var["value"] = "rs-plaintext"
    assert any("ROLLOUT_SERVE_ADMIN_KEY must come from a Secret" in e for e in _policy([deployment]))
    deployment = _one("Deployment")
    env = _front_door_container(deployment)["env"]
    env[:] = [v for v in env if v["name"] != "ROLLOUT_SERVE_ADMIN_KEY"]
    assert any("no ROLLOUT_SERVE_ADMIN_KEY" in e for e in _policy([deployment]))


def test_a_worker_secret_not_from_a_secret_is_rejected():
    dgd = _one("DynamoGraphDeployment")
    for var in dgd["spec"]["services"]["decode"]["envs"]:
        if var["name"] == "ROLLOUT_SERVE_WORKER_CONTROL_TOKEN":
            var.pop("valueFrom")
            var["value"] = "token"
    assert any("decode: ROLLOUT_SERVE_WORKER_CONTROL_TOKEN" in e for e in _policy([dgd]))


def test_an_unspecified_internal_host_is_rejected():
    deployment = _one("Deployment")
    args = _front_door_container(deployment)["args"]
    args[:] = ["--internal-host=0.0.0.0" if a.startswith("--internal-host=") else a for a in args]
    assert any("unspecified address" in e for e in _policy([deployment]))


@pytest.mark.parametrize("probe", ["startupProbe", "livenessProbe", "readinessProbe"])
def test_a_worker_left_with_the_operators_default_probe_is_rejected(probe):
    """The operator's default probes GET the system port at the pod IP; the worker binds it to 127.0.0.1."""
    dgd = _one("DynamoGraphDeployment")
    container = dgd["spec"]["services"]["prefill"]["extraPodSpec"]["mainContainer"]
    container[probe] = {"httpGet": {"path": "/health", "port": 9090}}
    assert any(f"prefill: its {probe} must run `rollout-serve worker-health`" in e for e in _policy([dgd]))
    del container[probe]
    assert any(f"prefill: its {probe} must run `rollout-serve worker-health`" in e for e in _policy([dgd]))
