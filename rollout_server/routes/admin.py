"""What every admin route shares: the admin-key dependency, the record of admin actions, the JSON body, and a
deploy's errors as API errors.

Admin routes need an admin key; in open mode a caller on loopback without a key is the local admin
(rollout_server/auth.py). Every action taken with admin rights is logged here, at INFO, with its caller.
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

from fastapi import Request

from finetune_deploy.executor import DeployBusy, DeployError
from rollout_server.auth import Principal
from rollout_server.errors import APIError, bad_request
from rollout_server.fast_json import parse_json

log = logging.getLogger(__name__)


def admin_only(principal: Callable[[Request], Awaitable[Principal]]) -> Callable[[Request], Awaitable[Principal]]:
    """The dependency of every deploy and weight-update route: an admin key (403 otherwise)."""
    async def admin(request: Request) -> Principal:
        who = await principal(request)
        if not who.is_admin:
            raise APIError(403, "Deploys and weight updates need an admin key (rollout-serve keys create --admin).",
                           code="admin_key_required")
        log_admin_action(request, who)
        return who
    return admin


def log_admin_action(request: Request, who: Principal) -> None:
    """The one record of an action taken with admin rights: what, and who (team, key prefix, client address)."""
    log.info("admin action: %s %s by team=%s key=%s client=%s", request.method, request.url.path, who.team,
             who.key_prefix or "none (open mode)", request.client.host if request.client else None)


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
