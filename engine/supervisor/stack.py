"""One deployment's processes: Dynamo's frontend (KV router) and its vLLM workers, started and stopped.

    front door --TCP (its own KV router) or HTTP--> Dynamo frontend :frontend_port --> dynamo.vllm worker i
                                                     (KV router) <--ZMQ KV events------------------'

`Stack` owns the processes: it checks that their ports are free, starts each in its own process group
(engine/supervisor/processes.py), restarts the ones that died, adds and removes workers, and stops them all.
What the processes say about their health is read by engine/supervisor/health.py.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from engine.control_access import SOCKET_ENV, TOKEN_ENV, new_token
from engine.gloo_weights import BACKEND as GLOO_BACKEND
from engine.ids import BASE_VERSION, PolicyVersion
from engine.kv_tier.config import TierConnectorConfig, kv_transfer_config
from engine.kv_tier.policy import write_adapter_version, write_policy_version
from engine.sessions import frontend_affinity_args
from engine.settings import EngineSettings
from engine.supervisor import disaggregation, kv_tier_service, ports
from engine.supervisor.compute_dtype import worker_dtype
from engine.supervisor.device import has_cuda
from engine.supervisor.event_broker import EventBroker
from engine.supervisor.processes import ChildProcess, ProcessSpec, stop_all
from engine.weight_stamps import VERSION_ENV

log = logging.getLogger(__name__)

# vLLM's request-latency histograms (queue, prefill, decode, end to end) start at 0.3 s; queue and prefill times
# of ms matter here (docs/benchmarks.md reads prefill queue time from them), so their buckets start at 1 ms.
LATENCY_BUCKETS = {"request_latency": [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                                       10.0, 20.0, 40.0, 80.0, 160.0, 320.0]}


class StackStartError(RuntimeError):
    pass


@dataclass(frozen=True)
class WorkerInfo:
    index: int
    system_port: int
    kv_events_port: int
    cpu: int                       # the core its engine threads are pinned to
    role: disaggregation.Role = "aggregated"
    nixl_port: int | None = None   # NIXL side channel (handshake) of a prefill/decode worker


def dynamo_env(settings: EngineSettings, discovery_dir: Path, event_broker_url: str) -> dict[str, str]:
    """File discovery (no etcd/NATS) unless etcd is asked for. Every internal listener binds one address: the
    request plane and response streams `internal_host` (loopback by default), the event plane none of its own (its
    publishers connect to the deployment's broker, engine/supervisor/event_broker.py), the system port (health,
    metrics: read by the supervisor on this host) loopback."""
    host = str(settings.internal_host)
    env = {
        "DYN_DISCOVERY_BACKEND": settings.discovery_backend,
        "DYN_REQUEST_PLANE": "tcp",
        "DYN_EVENT_PLANE": "zmq",
        "DYN_ZMQ_BROKER_URL": event_broker_url,
        "DYN_TCP_RPC_HOST": host,
        "DYN_EVENT_PLANE_HOST": host,
        "DYN_TCP_RESPONSE_STREAM_HOST": host,
        "DYN_SYSTEM_HOST": "127.0.0.1",
        "DYN_LOG": os.environ.get("DYN_LOG", "info"),
    }
    if settings.discovery_backend == "file":
        env["DYN_FILE_KV"] = str(discovery_dir)
    elif settings.etcd_endpoints:  # else the processes read ETCD_ENDPOINTS from the environment they inherit
        env["ETCD_ENDPOINTS"] = settings.etcd_endpoints
    return env


def worker_info(settings: EngineSettings, index: int, core: int,
                role: disaggregation.Role = "aggregated") -> WorkerInfo:
    """Worker `index` of a stack: each of its ports is its base in `settings` + `index` (a prefill/decode worker
    also has a NIXL side channel); its engine threads are pinned to `core` (modulo this host's cores)."""
    nixl_port = settings.disaggregation.nixl_side_channel_base_port + index if role != "aggregated" else None
    return WorkerInfo(index, settings.worker_system_base_port + index, settings.kv_events_base_port + index,
                      core % (os.cpu_count() or 1), role, nixl_port)


def worker_layout(settings: EngineSettings) -> list[WorkerInfo]:
    roles = disaggregation.worker_roles(settings)
    cores = disaggregation.worker_cores(roles, os.cpu_count() or 1)
    return [worker_info(settings, i, core, role) for i, (role, core) in enumerate(zip(roles, cores))]


def mocker_event_plane(env: dict[str, str]) -> dict[str, str]:
    """The event plane of a simulated deployment (engine.mocker_workers): direct, not through the broker.

    Dynamo 1.6.1's mocker publishes its KV events to a broker, but no router applies them (routers see no
    overlap; measured with Dynamo's own frontend too), while in direct mode they arrive. In direct mode each
    publisher binds every interface and advertises `DYN_EVENT_PLANE_HOST` (loopback by default): acceptable for a
    simulation, which carries no one's prompts, and the reason real workers keep the broker."""
    return {name: value for name, value in env.items() if name != "DYN_ZMQ_BROKER_URL"}


class Stack:
    """One Dynamo deployment: a frontend (KV router) and its workers, found through their own discovery
    directory. `rollout-serve up` runs the default pool as one; engine/supervisor/pools.py runs more.

    `state_dir` holds its run directory (logs, discovery files, KV tier version files); `cache_dir` vLLM's
    compiled artefacts."""

    def __init__(self, settings: EngineSettings, model_dir: Path, served_model_name: str, *, state_dir: Path,
                 cache_dir: Path, workers: list[WorkerInfo] | None = None):
        self.settings = settings
        self.model_dir = model_dir
        self.policy_version = BASE_VERSION  # what the weights in model_dir are (a restart loads the served ones)
        self.served_model_name = served_model_name
        self.state_dir = state_dir
        self.cache_dir = cache_dir
        self.run_dir = state_dir / f"stack-{settings.frontend_port}"
        self.workers = worker_layout(settings) if workers is None else workers
        self.children: list[ChildProcess] = []
        self.frontend: ChildProcess | None = None
        self.worker_children: dict[int, ChildProcess] = {}
        self.frontend_url = f"http://127.0.0.1:{settings.frontend_port}"
        self.dtype = worker_dtype(settings.dtype, model_dir, on_cpu=not has_cuda())
        self._env: dict[str, str] = {}
        self._event_broker: EventBroker | None = None
        self.control_token = new_token()  # workers' admin routes answer its holder alone (engine/control_access.py)

    @property
    def discovery_dir(self) -> Path:
        return self.run_dir / "discovery"

    def control_socket(self, worker_index: int) -> Path:
        """Worker i's admin routes (engine/worker/control_socket.py), in a directory only this user can enter."""
        return self.run_dir / "control" / f"worker-{worker_index}.sock"

    def dynamo_env(self) -> dict[str, str]:
        """The environment every Dynamo process of this deployment starts with (the front door's KV router too).
        Its KV-event broker starts with the first call and runs until the deployment stops."""
        if self._event_broker is None:
            fixed_port = self.settings.event_broker_port if self.settings.cluster else None  # workers name it
            self._event_broker = EventBroker(str(self.settings.internal_host), fixed_port)
        env = dynamo_env(self.settings, self.discovery_dir, self._event_broker.url)
        return mocker_event_plane(env) if self.settings.mocker_workers else env

    # ---- process specs -------------------------------------------------------------------

    def _frontend_spec(self, env: dict[str, str]) -> ProcessSpec:
        argv = [
            sys.executable, "-m", "dynamo.frontend",
            "--http-host", "127.0.0.1", "--http-port", str(self.settings.frontend_port),
            "--router-mode", self.settings.router_mode,
            "--discovery-backend", self.settings.discovery_backend,
        ]
        if self.settings.router_mode == "kv":
            argv += frontend_affinity_args(self.settings.session_affinity_ttl_s)
        argv += disaggregation.frontend_args(self.settings.disaggregation)
        if self.settings.kv_tier.enabled:  # the connectors announce tier blocks (engine/kv_tier/events.py)
            argv += ["--router-host-cache-hit-weight", str(self.settings.kv_tier.router_host_weight)]
        return ProcessSpec("dynamo-frontend", argv, env, self.run_dir / "frontend.log")

    def _worker_spec(self, worker: WorkerInfo, env: dict[str, str]) -> ProcessSpec:
        if self.settings.mocker_workers:
            return self._mocker_spec(worker, env)
        # vLLM's engine core publishes to the worker's own relay (Dynamo's KvEventPublisher): loopback only. vLLM
        # binds an endpoint only when it reads as a wildcard ("*" or "::" in it) and connects to any other, so
        # loopback is written IPv4-mapped: vLLM binds it, and ZMQ binds it as 127.0.0.1 (the relay connects to it)
        kv_events = {"enable_kv_cache_events": True, "publisher": "zmq",
                     "endpoint": f"tcp://[::ffff:127.0.0.1]:{worker.kv_events_port}"}
        argv = [
            sys.executable, "-m", "engine.worker.dynamo_worker",
            "--model", str(self.model_dir), "--served-model-name", self.served_model_name,
            "--block-size", str(self.settings.block_size),
            "--max-model-len", str(self.settings.max_model_len),
            "--dtype", self.dtype,
            "--custom-histogram-buckets", json.dumps(LATENCY_BUCKETS),
            "--kv-events-config", json.dumps(kv_events),
            "--kv-cache-memory-bytes", str(int(self.settings.kv_cache_gib * 2**30)),
            "--discovery-backend", self.settings.discovery_backend,
        ]
        if self.settings.enforce_eager:
            argv.append("--enforce-eager")
        # A trainer's weights arrive by broadcast: NCCL on CUDA, gloo on CPU (engine/worker/gloo_weight_transfer.py)
        argv += ["--weight-transfer-config", json.dumps({"backend": "nccl" if has_cuda() else GLOO_BACKEND})]
        argv += disaggregation.worker_args(worker.role, self.settings.disaggregation)
        lora = self.settings.lora
        if lora.enable_lora:
            argv += ["--enable-lora", "--max-lora-rank", str(lora.max_lora_rank), "--max-loras", str(lora.max_loras)]
        worker_env = {
            **env,
            "DYN_SYSTEM_ENABLED": "true",
            "DYN_SYSTEM_PORT": str(worker.system_port),
            "VLLM_CACHE_ROOT": str(self.cache_dir / "vllm"),
            "VLLM_NO_USAGE_STATS": "1",
            "HF_HUB_OFFLINE": "1",
            VERSION_ENV: str(self.policy_version),  # every token is stamped with its weights
            SOCKET_ENV: str(self.control_socket(worker.index)),
            TOKEN_ENV: self.control_token,
            **disaggregation.worker_env(
                worker.role, worker.nixl_port, self.settings.disaggregation, host=str(self.settings.internal_host),
                progress_thread=has_cuda() or self.settings.disaggregation.nixl_progress_thread),
        }
        if lora.enable_lora:
            worker_env["DYN_LORA_ENABLED"] = "true"  # Dynamo's loader for file:// adapter URIs
            worker_env["DYN_LORA_HOTSWAP_ENABLED"] = "true"  # a new version of an adapter replaces the old
        if self.settings.kv_tier.enabled and worker.role == "aggregated":
            argv += ["--kv-transfer-config", json.dumps(self._kv_tier_transfer_config(worker))]
            worker_env.update(kv_tier_service.worker_env())
        if worker.role == "prefill":
            argv += disaggregation.prefill_budget_args(self.settings.disaggregation)
        elif self.settings.step_token_budget:
            argv += ["--max-num-batched-tokens", str(self.settings.step_token_budget)]
        if not has_cuda():
            # Live weight updates, and seeded requests whose prompt is prefilled in chunks (engine/worker/cpu_worker.py)
            argv += ["--worker-extension-cls", "engine.worker.cpu_worker.CPUWorker"]
            worker_env["VLLM_TARGET_DEVICE"] = "cpu"
            worker_env["VLLM_CPU_OMP_THREADS_BIND"] = str(worker.cpu)
            worker_env["OMP_NUM_THREADS"] = str(self.settings.cpu_threads_per_worker)
        return ProcessSpec(f"vllm-{worker.role}-worker-{worker.index}", argv, worker_env, self.run_dir / f"worker-{worker.index}.log")

    def _mocker_spec(self, worker: WorkerInfo, env: dict[str, str]) -> ProcessSpec:
        """Worker process i as Dynamo's mocker engine (engine.mocker_workers): `mocker_workers` simulated workers
        in one process, each its own Dynamo runtime registered through this deployment's discovery directory,
        serving on the request plane as dynamo.vllm does and publishing its KV events on Dynamo's direct event
        plane (mocker_event_plane). The tokenizer is the served model's; there are no weights, no admin routes
        and no live weight updates."""
        argv = [
            sys.executable, "-m", "dynamo.mocker",
            "--model-path", str(self.model_dir), "--model-name", self.served_model_name,
            "--num-workers", str(self.settings.mocker_workers),
            "--block-size", str(self.settings.block_size),
            "--max-model-len", str(self.settings.max_model_len),
            "--speedup-ratio", str(self.settings.mocker_speedup_ratio),
            "--discovery-backend", self.settings.discovery_backend,
            "--request-plane", "tcp", "--event-plane", "zmq",
            "--stagger-delay", "0",
        ]
        if self.settings.step_token_budget:
            argv += ["--max-num-batched-tokens", str(self.settings.step_token_budget)]
        # The process's first runtime answers its system port: ready once it serves `generate`. The others cannot
        # bind it, so every runtime's model card goes to the discovery directory, not to its system port (where
        # Dynamo's frontend would find the first runtime's card alone, and route to one worker per process)
        worker_env = {**env, "DYN_SYSTEM_PORT": str(worker.system_port),
                      "DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS": json.dumps(["generate"]), "DYN_SELF_HOST_METADATA": "0",
                      "HF_HUB_OFFLINE": "1"}
        return ProcessSpec(f"mocker-worker-{worker.index}", argv, worker_env, self.run_dir / f"worker-{worker.index}.log")

    # ---- host-DRAM KV tier (engine/kv_tier, docs/kv_tier.md) -------------------------------

    def kv_tier_version_file(self, worker_index: int) -> Path:
        """The file worker i's KV tier connector reads its policy version from (engine/kv_tier/policy.py)."""
        return self.run_dir / "kv-tier" / f"policy-version.worker-{worker_index}"

    def set_kv_tier_policy_version(self, version: PolicyVersion, worker_indices: list[int] | None = None) -> None:
        """The live weight-update hook: the workers' KV is saved and looked up under `version` from now on."""
        for index in worker_indices if worker_indices is not None else [w.index for w in self.workers]:
            write_policy_version(self.kv_tier_version_file(index), version)

    def set_kv_tier_adapter_version(self, name: str, version: PolicyVersion | None, worker_index: int) -> None:
        """Worker i's KV of LoRA adapter `name` is saved and looked up under `version` from now on."""
        write_adapter_version(self.kv_tier_version_file(worker_index), name, version)

    def _kv_tier_transfer_config(self, worker: WorkerInfo) -> dict:
        tier = self.settings.kv_tier
        return kv_transfer_config(TierConnectorConfig(
            tier.master_address, self.served_model_name, tier.nvfp4, BASE_VERSION,
            str(self.kv_tier_version_file(worker.index)), announce=tier.router_host_weight > 0))

    def _kv_tier_specs(self) -> list[ProcessSpec]:
        tier = self.settings.kv_tier
        if not tier.enabled:
            return []
        self.set_kv_tier_policy_version(BASE_VERSION)  # workers start on the base weights
        log.info("KV tier: %s", kv_tier_service.describe_capacity(tier, self.model_dir, self.settings.block_size,
                                                                          self.dtype))
        return [kv_tier_service.master_spec(tier, self.run_dir), kv_tier_service.holder_spec(tier, self.run_dir)]

    # ---- life cycle ----------------------------------------------------------------------

    def _fixed_ports(self) -> dict[int, str]:
        """Port -> what listens there, for every port this stack's children bind by number."""
        wanted = {self.settings.frontend_port: "Dynamo frontend"}
        for worker in self.workers:
            wanted[worker.system_port] = f"worker {worker.index} health"
            wanted[worker.kv_events_port] = f"worker {worker.index} KV events"
            if worker.nixl_port is not None:
                wanted[worker.nixl_port] = f"worker {worker.index} NIXL side channel"
        tier = self.settings.kv_tier
        if tier.enabled:
            wanted |= {tier.master_port: "KV tier master (kv_tier.port_base)", tier.metrics_port: "KV tier metrics",
                      tier.holder_port: "KV tier segment holder"}
        return wanted

    def start(self) -> None:
        """Starts every process without waiting for it (engine/supervisor/health.py waits until they serve)."""
        taken = ports.ports_in_use(self._fixed_ports())
        if taken:
            raise StackStartError(f"port(s) already in use: {', '.join(taken)}; stop what holds them or choose "
                                  "other ports (rollout-serve up --help)")
        shutil.rmtree(self.discovery_dir, ignore_errors=True)  # stale registrations would confuse the router
        self.discovery_dir.mkdir(parents=True, exist_ok=True)
        self.control_socket(0).parent.mkdir(mode=0o700, exist_ok=True)
        self.control_socket(0).parent.chmod(0o700)  # also when it was made before, or under another umask
        self._env = self.dynamo_env()
        log.info("starting Dynamo frontend on :%d (router %s) and %d vLLM worker(s) (dtype %s); logs in %s",
                 self.settings.frontend_port, self.settings.router_mode, len(self.workers), self.dtype, self.run_dir)
        self.frontend = self._launch(self._frontend_spec(self._env))
        for worker in self.workers:
            self.worker_children[worker.index] = self._launch(self._worker_spec(worker, self._env))
        for spec in self._kv_tier_specs():
            self._launch(spec)

    def _launch(self, spec: ProcessSpec) -> ChildProcess:
        child = ChildProcess(spec)
        self.children.append(child)
        child.start()
        return child

    def settle_nixl_workers(self) -> None:
        """Pins NIXL workers' engine threads back to their own cores, once they have started."""
        for worker in self.workers:
            child = self.worker_children[worker.index]
            if worker.role != "aggregated" and child.pid and not has_cuda():
                disaggregation.settle_nixl_worker_threads(child.pid, int(worker.cpu))

    def stop(self) -> None:
        stop_stacks([self])

    def _forget_processes(self) -> None:
        self.children = []
        self.worker_children = {}
        self.frontend = None
        if self._event_broker is not None:
            self._event_broker.stop()
            self._event_broker = None

    # ---- changes while running (pools: scaling and restarts) ----------------------------

    def add_worker(self, worker: WorkerInfo) -> None:
        """Starts one more worker; it registers itself with the running frontend."""
        self.workers.append(worker)
        self.worker_children[worker.index] = self._launch(self._worker_spec(worker, self._env))

    def remove_worker(self, worker: WorkerInfo) -> None:
        """Stops a worker (SIGTERM: vLLM finishes nothing new, Dynamo deregisters it)."""
        self.workers.remove(worker)
        child = self.worker_children.pop(worker.index)
        stop_all([child])
        self.children.remove(child)

    def restart_dead(self) -> list[int]:
        """Starts again every process of this deployment that exited (a worker with `model_dir`, which the
        pool sets to the weights it serves now); returns the indices of the workers among them."""
        restarted = []
        for i, child in enumerate(self.children):
            if child.popen is None or child.alive():
                continue
            log.warning("%s exited with code %s: restarting it", child.spec.name, child.exit_code())
            child.signal_group(signal.SIGKILL)  # what it spawned (vLLM's engine core) goes with it
            worker = next((w for w in self.workers if self.worker_children.get(w.index) is child), None)
            fresh = ChildProcess(self._worker_spec(worker, self._env) if worker else child.spec)
            fresh.start()
            self.children[i] = fresh
            if child is self.frontend:
                self.frontend = fresh
            if worker:
                self.worker_children[worker.index] = fresh
                restarted.append(worker.index)
        return restarted

    def crashed_worker(self) -> str | None:
        """A worker process that exited (not stopped by us: those leave `worker_children`), described."""
        for child in self.worker_children.values():
            if child.popen is not None and not child.alive():
                return f"{child.spec.name} exit code {child.exit_code()}"
        return None

    def frontend_pid(self) -> int | None:
        return self.frontend.pid if self.frontend else None

    def worker_pids(self) -> list[int | None]:
        return [self.worker_children[w.index].pid for w in self.workers]

    def all_alive(self) -> bool:
        return all(child.alive() for child in self.children)


def start_cluster_worker(stack: Stack, event_broker_url: str) -> ChildProcess:
    """Starts the one worker of `stack` (`rollout-serve worker`, cluster mode) as `Stack.start` starts its
    workers, but with no frontend and no broker of its own: the worker registers through etcd and publishes its
    KV events to the front door's broker, `event_broker_url`, on the front door's host."""
    worker, = stack.workers
    taken = ports.ports_in_use({worker.system_port: "the worker's health port (--worker-system-base-port)",
                                worker.kv_events_port: "the worker's KV events (--kv-events-base-port)"})
    if taken:
        raise StackStartError(f"port(s) already in use: {', '.join(taken)}; choose another --index")
    stack.control_socket(worker.index).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    stack._env = dynamo_env(stack.settings, stack.discovery_dir, event_broker_url)
    log.info("starting a vLLM %s worker (dtype %s) that joins the cluster through etcd %s; its log: %s",
             worker.role, stack.dtype, stack._env.get("ETCD_ENDPOINTS") or os.environ.get("ETCD_ENDPOINTS"),
             stack.run_dir)
    stack.worker_children[worker.index] = stack._launch(stack._worker_spec(worker, stack._env))
    return stack.worker_children[worker.index]


def stop_stacks(stacks: list[Stack]) -> None:
    """Stops stacks together: their processes' graceful shutdowns overlap instead of adding up."""
    children = [child for stack in stacks for child in stack.children]
    if children:
        log.info("stopping %d process(es)", len(children))
        stop_all(children)
    for stack in stacks:
        stack._forget_processes()
