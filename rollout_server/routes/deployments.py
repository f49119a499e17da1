"""HTTP routes of deploys and RL weight sync (admin keys only).

- POST /v1/admin/deployments            register + deploy a checkpoint (202 with progress; `wait` for 200)
- GET  /v1/admin/deployments[/{version}] versions of the pool, their status, events and deploy progress
- POST /v1/admin/deployments/rollback   back to the version that served before (or `to_version`)
- POST /update_weights                  prime-rl: {"weight_dir"}; synchronous, every worker at once
- POST /v1/rl/update_weights            Dynamo's RL shape: base load, LoRA load/swap/unload; synchronous
  Both RL routes update in flight (`in_flight: keep`): rollouts running go on under the new weights.
- POST /pause, /resume (and /v1/rl/pause, /v1/rl/resume)   every worker of the pool

A well-formed request that the pool's state refuses is a 409: another deploy running, a checkpoint that cannot be
served (its files, or LoRA on workers without it), a version the registry refuses, no version to roll back to.
A path the server may not read checkpoints from is a 400 naming the field: outside the deploy roots, or a file
the checkpoint lists (a shard, a manifest entry, a symlink) that leads out of its directory.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse

from finetune_deploy.checkpoint_files import CheckpointError, UnsafeCheckpointPath
from finetune_deploy.executor import Deployer, DeployProgress, LoraDisabled
from finetune_deploy.registry import RegisteredVersion, RegistryError
from finetune_deploy.weight_transfer import WeightTransfer
from finetune_deploy.weight_update import WeightUpdate
from rollout_server.auth import Principal
from rollout_server.errors import APIError, error_responses
from rollout_server.openapi import json_body
from rollout_server.routes.admin import admin_only, json_body_of, worker_call
from rollout_server.routes.deployment_bodies import (
    DeploymentRequest,
    PrimeUpdateWeightsRequest,
    RLUpdateWeightsRequest,
    RollbackRequest,
    checkpoint_api_error,
    parse_request,
)
from rollout_server.routes.weight_transfer import pushed_round

# The error statuses of every route here: a missing or wrong key (401), a key that is not an admin's (403);
# and of one that deploys, also: a bad body (400), refused by the pool's state (409), a body over the limit (413),
# failed on a worker (502). One that names a pool, version or adapter adds its 404.
_ADMIN_ONLY = (401, 403)
_DEPLOYS = (*_ADMIN_ONLY, 400, 409, 413, 502)
# A deploy or rollback answers at once (202), or when done if the request says `wait` (200)
_DONE = {200: {"description": "Done (`wait`).", "content": {"application/json": {"schema": {}}}}}

log = logging.getLogger(__name__)


def deploy_router(deployer: Deployer, principal: Callable[[Request], Awaitable[Principal]],
                  transfer: WeightTransfer | None = None) -> APIRouter:
    router = APIRouter()
    running: set[asyncio.Task] = set()
    admin = admin_only(principal)

    async def answered_early(deploying: Callable[[asyncio.Future], Awaitable[DeployProgress]]) -> RegisteredVersion:
        """Starts a deploy that goes on after the response (202); returns its version once registered. A refusal
        before that (a bad checkpoint, another deploy running) is the response; a later failure is in the registry
        and the progress record, and in the log."""
        registered = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(deploying(registered))
        running.add(task)
        task.add_done_callback(running.discard)
        await asyncio.wait({registered, task}, return_when=asyncio.FIRST_COMPLETED)
        if not registered.done():
            task.result()  # refused before any version was registered: raises that refusal
        task.add_done_callback(_log_background_failure)
        return registered.result()

    @router.post("/v1/admin/deployments", dependencies=[Depends(admin)], status_code=202,
                 responses={**_DONE, **error_responses(*_DEPLOYS, 404)},
                 openapi_extra=json_body(DeploymentRequest))
    async def create_deployment(request: Request):
        req = parse_request(DeploymentRequest, await json_body_of(request))
        _check_pool(deployer, req.pool)
        update = req.weight_update()

        def deploying(registered: asyncio.Future | None = None) -> Awaitable[DeployProgress]:
            return _registration_answer(deployer.register_and_deploy(update, req.mode, req.in_flight, registered),
                                        update, param="path")

        if req.wait:
            return _progress_response(await deploying())
        version = await answered_early(deploying)
        return JSONResponse(_version_json(deployer, version), status_code=202,
                            headers={"Location": f"/v1/admin/deployments/{version.version}"})

    @router.get("/v1/admin/deployments", dependencies=[Depends(admin)], responses=error_responses(*_ADMIN_ONLY))
    async def list_deployments():
        versions = await asyncio.to_thread(deployer.registry.list, deployer.pool)
        return {"object": "list", "pool": deployer.pool, "data": [_version_json(deployer, v) for v in versions]}

    # Digits only in the path: /v1/admin/deployments/rollback is another route's, with no GET
    @router.get("/v1/admin/deployments/{version:int}", dependencies=[Depends(admin)],
                responses=error_responses(*_ADMIN_ONLY, 400, 404))
    async def get_deployment(version: int = Path(ge=0, le=2**63 - 1)):  # a 64-bit database integer
        try:
            found = await asyncio.to_thread(deployer.registry.get, deployer.pool, version)
        except RegistryError as exc:
            raise APIError(404, str(exc), param="version", code="version_not_found") from None
        events = [{"event": e.event, "message": e.message, "created_at": e.created_at}
                  for e in await asyncio.to_thread(deployer.registry.events, deployer.pool, version)]
        return {**_version_json(deployer, found), "events": events}

    @router.post("/v1/admin/deployments/rollback", dependencies=[Depends(admin)], status_code=202,
                 responses={**_DONE, **error_responses(*_DEPLOYS, 404)},
                 openapi_extra=json_body(RollbackRequest, required=False))
    async def rollback(request: Request):
        req = parse_request(RollbackRequest, await json_body_of(request))
        _check_pool(deployer, req.pool)

        def deploying(registered: asyncio.Future | None = None) -> Awaitable[DeployProgress]:
            return _rollback_answer(deployer.rollback(req.to_version, req.message, registered))

        if req.wait:
            return _progress_response(await deploying())
        return JSONResponse(_version_json(deployer, await answered_early(deploying)), status_code=202)

    @router.post("/update_weights", dependencies=[Depends(admin)], responses=error_responses(*_DEPLOYS),
                 openapi_extra=json_body(PrimeUpdateWeightsRequest))
    async def prime_update_weights(request: Request):
        update = parse_request(PrimeUpdateWeightsRequest, await json_body_of(request)).weight_update()
        deploying = deployer.register_and_deploy(update, "all_at_once", "keep")
        return _progress_response(await _registration_answer(deploying, update, param="weight_dir"))

    @router.post("/v1/rl/update_weights", dependencies=[Depends(admin)], responses=error_responses(*_DEPLOYS, 404),
                 openapi_extra=json_body(RLUpdateWeightsRequest))
    async def rl_update_weights(request: Request):
        req = parse_request(RLUpdateWeightsRequest, await json_body_of(request))
        if req.pushed is not None:
            if transfer is None:
                raise APIError(409, "This server takes no pushed weights.", param="transport.gloo",
                               code="weight_transfer_unavailable")
            return _progress_response(await pushed_round(transfer, req.pushed.update_info.model_dump(), req.version,
                                                         req.in_flight, req.running_kv))
        update = req.weight_update()
        if update.op == "unload":
            await _require_served_adapter(deployer, update.name)
            return _progress_response(await worker_call(deployer.unload_adapter(update.name)))
        deploying = deployer.register_and_deploy(update, "all_at_once", req.in_flight, running_kv=req.running_kv)
        return _progress_response(await _registration_answer(deploying, update, param="transport.filesystem.path"))

    for prefix in ("", "/v1/rl"):
        for path, endpoint in ((f"{prefix}/pause", _pause(deployer)), (f"{prefix}/resume", _resume(deployer))):
            router.add_api_route(path, endpoint, methods=["POST"], dependencies=[Depends(admin)],
                                 responses=error_responses(*_ADMIN_ONLY))
    return router


def _pause(deployer: Deployer):
    async def pause():
        await worker_call(deployer.pause_all())
        return {"status": "ok", "paused": True, "pool": deployer.pool}
    return pause


def _resume(deployer: Deployer):
    async def resume():
        await worker_call(deployer.resume_all())
        return {"status": "ok", "paused": False, "pool": deployer.pool}
    return resume


async def _require_served_adapter(deployer: Deployer, name: str) -> None:
    """Unloading an adapter the pool does not serve is the request's mistake (404), known before any worker is
    asked; the deployer would report it as a failed deploy (502)."""
    served = await asyncio.to_thread(deployer.registry.serving_adapters, deployer.pool)
    if all(adapter.name != name for adapter in served):
        raise APIError(404, f"Pool {deployer.pool!r} serves no adapter named {name!r}.", param="target.name",
                       code="adapter_not_found")


def _check_pool(deployer: Deployer, pool: str | None) -> None:
    if pool is not None and pool != deployer.pool:
        raise APIError(404, f"No pool named {pool!r}; this server's pool is {deployer.pool!r}.", param="pool",
                       code="pool_not_found")


async def _registration_answer(deploying: Awaitable[DeployProgress], update: WeightUpdate,
                               param: str) -> DeployProgress:
    """A deploy of a new checkpoint; one the pool cannot take is a 409 naming the request field `param`."""
    try:
        return await worker_call(deploying)
    except UnsafeCheckpointPath as exc:
        # A path the server may not read from, however well formed: refused as a permission (403), not as input
        raise APIError(403, f"Checkpoint path refused ({exc.field}): {exc.message}", param=param,
                       code="checkpoint_path_not_allowed") from None
    except CheckpointError as exc:
        raise checkpoint_api_error(exc, param=param) from None
    except OSError as exc:  # a path the server cannot look into (a name too long, no permission)
        raise checkpoint_api_error(CheckpointError(f"cannot read {update.path}: {exc.strerror}", "path"),
                                   param=param) from None
    except LoraDisabled as exc:
        raise APIError(409, str(exc), param=param, code="lora_not_enabled") from None
    except RegistryError as exc:
        raise APIError(409, str(exc), param="version" if update.version is not None else param,
                       code="invalid_version") from None


async def _rollback_answer(deploying: Awaitable[DeployProgress]) -> DeployProgress:
    try:
        return await worker_call(deploying)
    except RegistryError as exc:  # no earlier version, or one that cannot serve again
        raise APIError(409, str(exc), param="to_version", code="invalid_rollback") from None


def _log_background_failure(task: asyncio.Task) -> None:
    """Background deploys: the outcome is in the registry and the progress record; a failure is also logged."""
    if not task.cancelled() and task.exception() is not None:
        error = task.exception()
        log.error("background deploy: %s", error.message if isinstance(error, APIError) else error)


def _version_json(deployer: Deployer, version: RegisteredVersion) -> dict:
    body = {"object": "deployment", "pool": version.pool, "version": version.version, "name": version.name,
            "kind": version.kind, "path": version.path, "status": version.status,
            "parent_version": version.parent_version, "created_at": version.created_at}
    progress = deployer.latest(version.version)
    if progress is not None:
        body["progress"] = progress.as_dict()
    return body


def _progress_response(progress: DeployProgress) -> JSONResponse:
    return JSONResponse({"status": "ok", **progress.as_dict()})
