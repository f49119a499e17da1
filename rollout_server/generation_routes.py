"""The generation routes (chat, completions, generate) as a plain ASGI app in front of FastAPI.

They carry nearly every request the front door serves, and FastAPI's machinery around a request is a large
share of the front door's CPU for a short one: its middleware stack, the route table, two exit stacks,
dependency solving, content-type parsing, and a `send` wrapper per middleware that every streamed event
passes through (docs/benchmarks.md, "Measurements behind design choices"). Here a POST to one of them is
authenticated, read, parsed, validated and handed to its handler, whose response goes out with the server's own
`send`. Every other request goes on to the FastAPI app, and the answers are the app's: the same order of checks
(key, body, fields) and the same OpenAI error JSON (rollout_server/errors.py). Middleware added to the FastAPI
app does not see these routes: what they need goes here.

The key comes first, for every route: a request whose method may carry a body (POST, PUT, PATCH, DELETE) is
authenticated here before any byte of its body is read, and a caller without a valid key is answered 401 at once,
so that no one without a key can make the server read, spool or parse anything. The principal rides in the
request's scope (`principal_of`) to the FastAPI routes' dependency, which authenticates only requests that carry
no body.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from rollout_server.auth import Authenticator, Principal
from rollout_server.chat import chat_completions
from rollout_server.completions import completions
from rollout_server.disconnect import unless_disconnected
from rollout_server.errors import (
    APIError,
    bad_request,
    error_response,
    internal_error,
    not_a_json_object,
    validation_error,
)
from rollout_server.fast_json import MsgspecRequest
from rollout_server.generate import generate
from rollout_server.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest
from rollout_server.serving.context import ServingContext

log = logging.getLogger(__name__)

Handler = Callable[[ServingContext, Any, str | None, Principal], Awaitable[Response]]


@dataclass(frozen=True)
class GenerationRoute:
    body: type[BaseModel]
    handler: Handler          # (ctx, the validated body, the X-Session-ID header, the caller) -> the response


GENERATION_ROUTES = {
    "/v1/chat/completions": GenerationRoute(ChatCompletionRequest, chat_completions),
    "/v1/completions": GenerationRoute(CompletionRequest, completions),
    "/inference/v1/generate": GenerationRoute(GenerateRequest, generate),
}

# What a generation route answers instead of its 200: a bad body or field (400), a missing or wrong key (401), a
# pool reserved for another team (403), no such model or pool (404), no worker at min_policy_version yet or a
# request_id already running (409), a body over the limit (413), a rate limit or quota (429), no engine now (503),
# the engine's timeout (504). The OpenAPI document lists them.
ERROR_STATUSES = (400, 401, 403, 404, 409, 413, 429, 503, 504)


BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_PRINCIPAL = "rollout_serve.principal"  # the scope's key of the principal authenticated before the body


def client_host(scope: Scope) -> str | None:
    """The address of the request's client (None over a Unix socket)."""
    return scope["client"][0] if scope.get("client") else None


def principal_of(scope: Scope) -> Principal | None:
    """The principal `GenerationRoutes` authenticated before reading the request's body, if it did."""
    return scope.get(_PRINCIPAL)


def validated(model: type[BaseModel], body: Any) -> BaseModel:
    """The request body as `model`, or a 400 naming the first field at fault."""
    if not isinstance(body, dict):  # no body, bytes not sent as JSON, or JSON that is not an object
        raise not_a_json_object()
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(RequestValidationError(exc.errors())) from None


class GenerationRoutes:
    """ASGI: the generation routes served here, everything else by `app`."""

    def __init__(self, app: ASGIApp, ctx: ServingContext, auth: Authenticator, max_body_bytes: int,
                 routes: dict[str, GenerationRoute] = GENERATION_ROUTES, max_json_depth: int | None = None):
        self.app = app
        self.ctx = ctx
        self.auth = auth
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = self.routes.get(scope["path"])
        if route is not None and scope["method"] != "POST":
            response = error_response(APIError(405, "Method Not Allowed", headers={"Allow": "POST"}))
            return await response(scope, receive, send)
        if scope["method"] in BODY_METHODS:
            try:
                scope[_PRINCIPAL] = await self.auth.authenticate(Headers(scope=scope).get("authorization"),
                                                                 client_host(scope))
            except APIError as err:
                return await error_response(err)(scope, receive, send)
        if route is None:
            return await self.app(scope, receive, send)
        response = await self._answer(route, MsgspecRequest(scope, receive))
        await response(scope, receive, send)

    async def _answer(self, route: GenerationRoute, request: MsgspecRequest) -> Response:
        try:
            body = await self._json_body(request)
            who = principal_of(request.scope)
            handling = route.handler(self.ctx, validated(route.body, body), request.headers.get("x-session-id"), who)
            return await unless_disconnected(request, handling)
        except APIError as err:
            return error_response(err)
        except Exception as exc:
            log.exception("unexpected error serving POST %s", request.url.path)
            return error_response(internal_error(exc))  # uvicorn closes the connection on its header

    async def _json_body(self, request: MsgspecRequest) -> Any:
        """The body as FastAPI reads one for a model: parsed when sent as JSON, else its bytes (None if empty)."""
        request.max_body_bytes = self.max_body_bytes
        request.max_json_depth = self.max_json_depth
        try:
            raw = await request.body()
            if not raw or not _is_json(request.headers.get("content-type", "")):
                return raw or None
            return await request.json()
        except HTTPException as exc:  # over the size limit
            raise APIError(exc.status_code, str(exc.detail), headers=exc.headers) from None
        except ValueError as exc:  # json.JSONDecodeError
            raise bad_request(f"Malformed JSON in request body: {getattr(exc, 'msg', exc)}", code="invalid_json") from None
        except Exception:
            raise bad_request("There was an error parsing the body") from None


def _is_json(content_type: str) -> bool:
    kind = content_type.partition(";")[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))
