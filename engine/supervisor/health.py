"""What a stack's processes say about themselves: Dynamo's health and metrics endpoints, read.

A worker is ready when its Dynamo system port says so; a deployment serves when its frontend lists the model
with every worker registered and places a request. Every probe is a loopback HTTP call with a short timeout
(engine/supervisor/loopback_http.py); a probe that fails reads as "not ready", never as an error.
"""

from __future__ import annotations

import logging
import re
import time

import httpx
from tqdm import tqdm

from engine.ids import worker_id_from_hex
from engine.supervisor import kv_tier_service
from engine.supervisor.device import has_cuda
from engine.supervisor.loopback_http import LOOPBACK
from engine.supervisor.stack import Stack, StackStartError
from engine.supervisor.worker_control import CPU_RELOAD_RPC, CUDA_RELOAD_RPC, WorkerHandle

log = logging.getLogger(__name__)


class StackHealth:
    """The health of one `Stack`'s processes."""

    def __init__(self, stack: Stack):
        self.stack = stack

    def wait_until_ready(self) -> None:
        """Waits for every child's health check, then settles NIXL workers' threads; stops the stack on failure."""
        try:
            self._wait_until_healthy()
            self.stack.settle_nixl_workers()
        except BaseException:
            self.stack.stop()
            raise

    def serves_a_request(self) -> bool:
        """A one-token completion through the frontend succeeds: Dynamo lists a model before its router
        can place requests on the new worker (it answers 503 "not ready" for a moment)."""
        body = {"model": self.stack.served_model_name, "prompt": [1], "max_tokens": 1}
        try:
            return LOOPBACK.post(f"{self.stack.frontend_url}/v1/completions", json=body, timeout=30.0).status_code == 200
        except httpx.HTTPError:
            return False

    def ready_workers(self) -> int:
        return len(self.ready_worker_indices()) + len(self.joined_workers())

    def ready_worker_indices(self) -> list[int]:
        """Workers that answer ready, provided the frontend answers and lists the model (none otherwise)."""
        stack = self.stack
        if stack.frontend is None or not stack.frontend.alive() or not self._frontend_lists_model():
            return []
        return [w.index for w in stack.workers if stack.worker_children[w.index].alive()
                and worker_ready(w.system_port)]

    def unlisted_workers(self) -> list[int]:
        """Workers whose process runs and whose engine says ready, yet whom Dynamo's frontend does not list among
        the instances of `generate`: their registration in the discovery directory expired (a machine that
        stalled longer than Dynamo's file-store TTL, 30 s, has every registration expire; a worker does not
        register again by itself). None while the frontend cannot be asked."""
        stack = self.stack
        if stack.settings.discovery_backend != "file":
            return []
        listed = {i["instance_id"] for i in self._frontend_instances() if i.get("endpoint") == "generate"}
        if len(listed) >= len(stack.workers):  # the usual case, answered without asking each worker
            return []
        unlisted = []
        for worker in stack.workers:
            child = stack.worker_children.get(worker.index)
            if child is None or not child.alive() or not worker_ready(worker.system_port):
                continue
            instance = worker_metrics(worker.system_port).get("instance_id")
            if instance is not None and int(instance) not in listed:
                unlisted.append(worker.index)
        return unlisted

    def joined_workers(self) -> list[dict]:
        """Cluster mode: the workers that joined through etcd (on any host; none is this stack's child) and serve
        requests, as Dynamo's frontend lists them on its /health: instances of the `generate` endpoint of the
        `backend` component (aggregated or decode workers; prefill workers serve only through those). None while
        the frontend does not list the model. One host: none."""
        if not self.stack.settings.cluster:
            return []
        serving = {i["instance_id"]: i for i in self._frontend_instances()
                   if i.get("component") == "backend" and i.get("endpoint") == "generate"}
        return list(serving.values()) if serving and self._frontend_lists_model() else []

    def _frontend_instances(self) -> list[dict]:
        """The worker instances Dynamo's frontend knows through discovery (its /health); none while it is down."""
        stack = self.stack
        if stack.frontend is None or not stack.frontend.alive():
            return []
        try:
            instances = LOOPBACK.get(f"{stack.frontend_url}/health", timeout=2.0).json().get("instances") or []
        except (httpx.HTTPError, ValueError):
            return []
        return [i for i in instances if isinstance(i, dict) and "instance_id" in i]

    def worker_status(self) -> list[dict]:
        """One row per worker: its process, health, Dynamo instance id and in-flight requests (a worker that
        joined from another host: its instance id and address; its process and load are its host's)."""
        rows = [{"worker": f"joined-{i['instance_id']}", "role": "joined", "pid": None, "alive": True,
                 "healthy": True, "instance_id": i["instance_id"], "inflight_requests": None,
                 "address": _address(i.get("transport"))} for i in self.joined_workers()]
        for worker in self.stack.workers:
            child = self.stack.worker_children[worker.index]
            metrics = worker_metrics(worker.system_port)
            rows.append({
                "worker": worker.index,
                "role": worker.role,
                "pid": child.pid,
                "alive": child.alive(),
                "healthy": worker_ready(worker.system_port),
                "instance_id": metrics.get("instance_id"),
                "inflight_requests": metrics.get("inflight_requests", 0.0),
            })
        return rows

    def worker_handles(self) -> list[WorkerHandle]:
        """Every worker, as the deployer reaches it: Dynamo instance id and admin routes (control socket, token)."""
        reload_rpc = CUDA_RELOAD_RPC if has_cuda() else CPU_RELOAD_RPC
        return [WorkerHandle(w.index, w.system_port, worker_metrics(w.system_port).get("instance_id"), reload_rpc,
                             w.role, self.stack.control_socket(w.index), self.stack.control_token)
                for w in self.stack.workers]

    # ---- start-up ------------------------------------------------------------------------

    def _wait_until_healthy(self) -> None:
        stack = self.stack
        timeout_s = stack.settings.startup_timeout_s
        deadline = time.monotonic() + timeout_s
        pending = {f"worker-{w.index}" for w in stack.workers} | {"frontend"}
        if stack.settings.kv_tier.enabled:
            pending.add("kv-tier")
        with tqdm(total=len(pending), desc="starting stack", unit="proc", disable=None) as bar:
            while pending:
                self._raise_if_a_child_died()
                if time.monotonic() > deadline:
                    raise StackStartError(f"not healthy after {timeout_s:.0f}s: {sorted(pending)}; "
                                          f"see logs in {stack.run_dir}")
                for name in sorted(pending):
                    if self._is_healthy(name):
                        pending.discard(name)
                        bar.update(1)
                        log.info("%s is healthy", name)
                time.sleep(1.0)

    def _is_healthy(self, name: str) -> bool:
        if name == "frontend":
            return self._frontend_lists_model_with_all_workers()
        if name == "kv-tier":
            return kv_tier_service.is_ready(self.stack.settings.kv_tier)
        worker = self.stack.workers[int(name.split("-")[1])]
        return worker_ready(worker.system_port)

    def _frontend_lists_model_with_all_workers(self) -> bool:
        if not all(worker_ready(w.system_port) for w in self.stack.workers):
            return False
        if not self.stack.workers:  # a serverless pool at zero: the frontend only has to answer
            try:
                return LOOPBACK.get(f"{self.stack.frontend_url}/v1/models", timeout=2.0).status_code == 200
            except httpx.HTTPError:
                return False
        return self._frontend_lists_model()

    def _frontend_lists_model(self) -> bool:
        try:
            models = LOOPBACK.get(f"{self.stack.frontend_url}/v1/models", timeout=2.0).json()
        except (httpx.HTTPError, ValueError):
            return False
        return any(m.get("id") == self.stack.served_model_name for m in models.get("data", []))

    def _raise_if_a_child_died(self) -> None:
        for child in self.stack.children:
            if not child.alive():
                raise StackStartError(
                    f"{child.spec.name} exited with code {child.exit_code()} during start-up; last log lines:\n"
                    f"{child.log_tail()}")


def _address(transport) -> str | None:
    """Where a joined worker serves, from Dynamo's instance transport (e.g. {"tcp": "10.0.0.2:41233/..."})."""
    if isinstance(transport, dict) and transport:
        return str(next(iter(transport.values())))
    return str(transport) if transport else None


READY = "ready"  # a worker's /health status once its endpoints serve (Dynamo's system server)


def worker_health(system_port: int) -> dict:
    """A worker's /health answer on its loopback system port ({} when it does not answer)."""
    try:
        return LOOPBACK.get(f"http://127.0.0.1:{system_port}/health", timeout=2.0).json()
    except (httpx.HTTPError, ValueError):
        return {}


def worker_ready(system_port: int) -> bool:
    return worker_health(system_port).get("status") == READY


_VLLM_SAMPLE = re.compile(r'^(vllm:[a-z0-9_]+)(?:\{([^}]*)\})?\s+([0-9.eE+-]+)$')


def vllm_counter(system_port: int, name: str, **labels: str) -> float:
    """The sum of a vLLM metric's samples on a worker's system port whose labels include `labels`."""
    return metric_total(LOOPBACK.get(f"http://127.0.0.1:{system_port}/metrics", timeout=10).text, name, **labels)


def vllm_quantile(system_port: int, name: str, q: float) -> float | None:
    """The q-quantile of a vLLM histogram on a worker's system port (histogram_quantile)."""
    return histogram_quantile(LOOPBACK.get(f"http://127.0.0.1:{system_port}/metrics", timeout=10).text, name, q)


def histogram_quantile(text: str, name: str, q: float) -> float | None:
    """The q-quantile of a vLLM histogram in a Prometheus text page, over all its label sets, as Prometheus'
    histogram_quantile computes it (linear within the bucket that holds it); None without observations."""
    counts: dict[float, float] = {}
    for line in text.splitlines():
        match = _VLLM_SAMPLE.match(line)
        if match and match.group(1) == f"{name}_bucket":
            bound = re.search(r'le="([^"]+)"', match.group(2) or "").group(1)
            counts[float(bound)] = counts.get(float(bound), 0.0) + float(match.group(3))
    bounds = sorted(counts)
    if not bounds or counts[bounds[-1]] == 0:
        return None
    rank, lower, below = q * counts[bounds[-1]], 0.0, 0.0
    for bound in bounds:
        if counts[bound] >= rank:
            if bound == float("inf"):
                return lower  # beyond the last finite bound: that bound, as Prometheus says
            return lower + (bound - lower) * (rank - below) / max(counts[bound] - below, 1e-12)
        lower, below = bound, counts[bound]
    return lower


def metric_total(text: str, name: str, **labels: str) -> float:
    """The sum of a vLLM metric's samples in a Prometheus text page whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        match = _VLLM_SAMPLE.match(line)
        if match and match.group(1) == name and all(f'{k}="{v}"' in (match.group(2) or "") for k, v in labels.items()):
            total += float(match.group(3))
    return total


def worker_metrics(system_port: int) -> dict:
    """A worker's Dynamo instance id (`instance_id`, a WorkerId) and its requests in flight, from its /metrics."""
    try:
        text = LOOPBACK.get(f"http://127.0.0.1:{system_port}/metrics", timeout=2.0).text
    except httpx.HTTPError:
        return {}
    found: dict = {}
    for line in text.splitlines():
        if not line.startswith("dynamo_component_inflight_requests{") or 'dynamo_endpoint="generate"' not in line:
            continue
        found["instance_id"] = worker_id_from_hex(line.split('worker_id="', 1)[1].split('"', 1)[0])
        found["inflight_requests"] = float(line.rsplit(" ", 1)[1])
    return found
