"""`rollout-serve worker`: one vLLM worker that joins a cluster-mode front door (`rollout-serve up --cluster`).

    host A:  rollout-serve up --cluster --etcd-endpoints http://ETCD:2379 --internal-host A_PRIVATE_IP
    host B:  rollout-serve worker --etcd-endpoints http://ETCD:2379 --internal-host B_PRIVATE_IP \
                                  --front-door A_PRIVATE_IP

(`--cluster` is implied; `--etcd-endpoints` may come from the environment as ETCD_ENDPOINTS instead.)

The worker is the process `rollout-serve up` would start (engine/supervisor/stack.py), with three differences:
it registers through etcd instead of a discovery directory, it serves requests on Dynamo's TCP request plane at
its own `--internal-host`, and it publishes its KV events to the front door's broker
(`--front-door`:`--event-broker-port`), so that the front door's KV router knows what it caches. It runs until
Ctrl-C or SIGTERM, which stop it (Dynamo takes it out of etcd); if it dies, this command exits with its code.
"""

from __future__ import annotations

import argparse
import logging
import signal
import time

from rollout_server.cli.settings_flags import add_settings_arguments, settings_from_args

log = logging.getLogger("rollout_serve")
HEALTH_POLL_S = 1.0


def add_worker_commands(sub: argparse._SubParsersAction) -> None:
    worker = sub.add_parser("worker", help="start one vLLM worker that joins a cluster-mode front door",
                            description=__doc__.split("\n\n")[0])
    worker.add_argument("--role", choices=["aggregated", "prefill", "decode"], default="aggregated",
                        help="what the worker does (prefill/decode: disaggregated serving; default: aggregated)")
    worker.add_argument("--front-door", required=True, metavar="HOST",
                        help="the front door's internal address (its --internal-host) or DNS name, where its KV-event "
                             "broker is")
    worker.add_argument("--index", type=int, default=0,
                        help="this worker's number on its host: its ports are the base ports + index (default 0)")
    add_settings_arguments(worker)
    worker.set_defaults(func=cmd_worker)
    probe = sub.add_parser("worker-health", help="probe this host's worker: exit 0 when it is ready (a Kubernetes "
                                                 "exec probe)", description=cmd_worker_health.__doc__)
    probe.add_argument("--index", type=int, default=0, help="the worker's --index (default 0)")
    probe.add_argument("--live", action="store_true",
                       help="liveness: exit 0 while the worker answers at all, ready or still starting")
    add_settings_arguments(probe)
    probe.set_defaults(func=cmd_worker_health)


def cmd_worker(args: argparse.Namespace) -> int:
    from engine.supervisor.event_broker import broker_url
    from engine.supervisor.health import worker_ready
    from engine.supervisor.processes import stop_all
    from engine.supervisor.stack import Stack, StackStartError, start_cluster_worker, worker_info
    from rollout_server.tiny_model.builder import resolve_model

    args.cluster = True  # a worker of its own is always one of a cluster's: found through etcd
    settings = settings_from_args(args)
    engine = settings.engine
    worker = worker_info(engine, args.index, core=args.index, role=args.role)
    model_dir, model_name = resolve_model(settings)
    stack = Stack(engine, model_dir, model_name, state_dir=settings.state.resolved_state_dir,
                  cache_dir=settings.state.cache_dir, workers=[worker])
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        child = start_cluster_worker(stack, broker_url(args.front_door, engine.event_broker_port))
        ready = False
        while child.alive():
            if not ready and worker_ready(worker.system_port):
                ready = True
                log.info("worker %d (%s) ready and registered through etcd", worker.index, worker.role)
            time.sleep(HEALTH_POLL_S)
        log.error("the worker exited with code %s:\n%s", child.exit_code(), child.log_tail())
        return 1
    except StackStartError as exc:
        log.error("%s", exc)
        return 1
    except KeyboardInterrupt:
        log.info("interrupted: stopping the worker")
        return 0
    finally:
        stop_all(stack.children)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def cmd_worker_health(args: argparse.Namespace) -> int:
    """Exit 0 when this host's worker --index answers ready on its system port (with --live: answers at all), else
    1. Give it the settings the worker was given (its ports are the base ports + index). The system port binds
    127.0.0.1, which a kubelet's HTTP probe cannot reach: Kubernetes runs this in the worker's container instead
    (deploy/k8s/workers.yaml)."""
    from engine.supervisor.health import READY, worker_health
    from engine.supervisor.stack import worker_info

    port = worker_info(settings_from_args(args).engine, args.index, core=0).system_port
    status = worker_health(port).get("status")
    print(f"worker {args.index} (system port {port}): {status or 'no answer'}")
    return 0 if (status is not None if args.live else status == READY) else 1
