"""HTTP routes of a trainer's pushed weights (admin keys only): vLLM's weight-transfer routes, for the whole pool.

The same paths and bodies as vLLM's RL server (`vllm/entrypoints/rl/online/api_router.py`), under
/v1/rl/weight_transfer, so trainers written for vLLM's flow drive them the same way:
- GET  get_world_size                   {"world_size"}: the receiving ranks (every worker, and the recorder)
- POST init_weight_transfer_engine      {"init_info": {...}}: the trainer's group; once per trainer
- POST start_weight_update              {"in_flight"?, "running_kv"?}: workers paused (default keep)
- POST update_weights                   {"update_info": {...}}: while the trainer broadcasts; one or more
- POST finish_weight_update             {"weight_version"}: an integer above every version the pool had
- POST shutdown_weight_transfer_engine
What a round does: finetune_deploy/weight_transfer.py. A call the pool's state refuses (out of order, a group that
does not fit the pool) is a 409; init or update info that does not fit is a 400 naming the field; a worker's
failure is a 502 (the pool then serves what it served). Unlike vLLM's, the routes need an admin key:
vLLM's client sends none, so it drives a server in open local mode; PoolWeightSync sends one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Depends, Request
from pydantic import ConfigDict

from engine.weight_stamps import RunningKv
from finetune_deploy.executor import DeployProgress
from finetune_deploy.registry import RegistryError
from finetune_deploy.settings import InFlight
from finetune_deploy.weight_transfer import TransferRefused, WeightTransfer
from rollout_server.auth import Principal
from rollout_server.errors import APIError, bad_request, error_responses
from rollout_server.openapi import DocumentedModel, json_body
from rollout_server.routes.admin import admin_only, json_body_of, worker_call
from rollout_server.routes.deployment_bodies import GlooInit, GlooUpdate, parse_request

PREFIX = "/v1/rl/weight_transfer"
_CALLS = (401, 403, 400, 409, 413, 502)


class InitRequest(DocumentedModel):
    model_config = ConfigDict(extra="ignore")

    init_info: GlooInit


class StartRequest(DocumentedModel):
    model_config = ConfigDict(extra="ignore")

    in_flight: InFlight = "keep"  # requests running go on under the new weights, each token stamped
    running_kv: RunningKv | None = None  # in_flight keep: their old-weights KV kept or recomputed; None: the default


class UpdateRequest(DocumentedModel):
    model_config = ConfigDict(extra="ignore")

    update_info: GlooUpdate


class FinishRequest(DocumentedModel):
    model_config = ConfigDict(extra="ignore")

    weight_version: int  # the policy version the pushed weights serve as; "12" is accepted as 12


def weight_transfer_router(transfer: WeightTransfer, principal: Callable[[Request], Awaitable[Principal]]) -> APIRouter:
    router = APIRouter(prefix=PREFIX, dependencies=[Depends(admin_only(principal))])

    @router.get("/get_world_size", responses=error_responses(401, 403))
    async def get_world_size():
        return {"world_size": await transfer.world_size(), "backend": transfer.backend}

    @router.post("/init_weight_transfer_engine", responses=error_responses(*_CALLS),
                 openapi_extra=json_body(InitRequest))
    async def init_weight_transfer_engine(request: Request):
        req = parse_request(InitRequest, await json_body_of(request))
        await _refusable(transfer.connect(req.init_info.model_dump()), param="init_info")
        return {"message": "Weight transfer initialized"}

    @router.post("/start_weight_update", responses=error_responses(*_CALLS), openapi_extra=json_body(StartRequest))
    async def start_weight_update(request: Request):
        req = parse_request(StartRequest, await json_body_of(request))
        await _refusable(transfer.start(req.in_flight, req.running_kv))
        return {"message": "Weight update started", "in_flight": req.in_flight}

    @router.post("/update_weights", responses=error_responses(*_CALLS), openapi_extra=json_body(UpdateRequest))
    async def update_weights(request: Request):
        req = parse_request(UpdateRequest, await json_body_of(request))
        await _refusable(transfer.update(req.update_info.model_dump()), param="update_info")
        return {"message": "Weights updated"}

    @router.post("/finish_weight_update", responses=error_responses(*_CALLS), openapi_extra=json_body(FinishRequest))
    async def finish_weight_update(request: Request):
        req = parse_request(FinishRequest, await json_body_of(request))
        progress = await _finished(transfer.finish(req.weight_version), param="weight_version")
        return {"message": "Weight update finished", **progress.as_dict()}

    @router.post("/shutdown_weight_transfer_engine", responses=error_responses(*_CALLS))
    async def shutdown_weight_transfer_engine():
        await _refusable(transfer.disconnect())
        return {"message": "Weight transfer shut down"}

    return router


async def pushed_round(transfer: WeightTransfer, update_info: dict, version: int, in_flight: str,
                       running_kv: RunningKv | None) -> DeployProgress:
    """POST /v1/rl/update_weights with transport gloo: a whole round in one call (the trainer broadcasts meanwhile)."""
    await _refusable(transfer.start(in_flight, running_kv))
    await _refusable(transfer.update(update_info), param="transport.gloo.update_info")
    return await _finished(transfer.finish(version), param="version")


async def _finished(work: Awaitable[DeployProgress], param: str) -> DeployProgress:
    try:
        return await _refusable(work)
    except RegistryError as exc:
        raise APIError(409, str(exc), param=param, code="invalid_version") from None


async def _refusable(work: Awaitable, param: str | None = None):
    """A call the pool's state refuses is a 409; init or update info that does not fit, a 400 naming `param`."""
    try:
        return await worker_call(work)
    except TransferRefused as exc:
        if exc.bad_field and param:
            raise bad_request(str(exc), param=param, code="invalid_value") from None
        raise APIError(409, str(exc), param=exc.field, code=exc.code) from None
