"""What every admin route shares: the admin-key dependency, the JSON body, and a deploy's errors as API errors."""

from __future__ import annotations

from typing import Awaitable, Callable

from fastapi import Request

from finetune_deploy.executor import DeployBusy, DeployError
from rollout_server.auth import Principal
from rollout_server.errors import APIError, bad_request
from rollout_server.fast_json import parse_json


def admin_only(principal: Callable[[Request], Awaitable[Principal]]) -> Callable[[Request], Awaitable[Principal]]:
    """The dependency of every deploy and weight-update route: an admin key (403 otherwise)."""
    async def admin(request: Request) -> Principal:
        who = await principal(request)
        if not who.is_admin:
            raise APIError(403, "Deploys and weight updates need an admin key (rollout-serve keys create --admin).",
                           code="admin_key_required")
        return who
    return admin


async def json_body_of(request: Request) -> object:
    try:
        return parse_json(await request.body() or b"{}")
    except ValueError as exc:
        raise bad_request(f"Malformed JSON in request body: {exc}", code="invalid_json") from None


async def worker_call(work):
    try:
        return await work
    except DeployBusy as exc:
        raise APIError(409, f"{exc}; retry when it has finished.", code="deploy_in_progress",
                       headers={"Retry-After": "5"}) from None
    except DeployError as exc:
        raise APIError(502, f"Deploy failed: {exc}", code="deploy_failed", type="api_error") from None
