"""OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}} with the right HTTP status.

Every failure a client can cause is a 4xx naming the field; a stack that cannot
serve is a 503. Nothing reaches the client as a bare 500. A validation error is a 400, never FastAPI's 422.
A well-formed request that the server's state refuses (another deploy running, no earlier version to roll
back to, a checkpoint it cannot serve) is a 409. A 405 names every method its path is served with (`Allow`).

Each route declares the error statuses it can answer where it is declared (`error_responses`), with what
each means on this API (`ERROR_MEANINGS`): the OpenAPI document (rollout_server/openapi.py) reads them there.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from engine.contract import EngineRequest
from engine.errors import ContextLengthExceeded, EngineError, EngineTimeout, EngineUnavailable, RequestRejected

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error", 413: "invalid_request_error",
          429: "rate_limit_error", 503: "service_unavailable", 504: "timeout_error"}

# What each error status means on this API, as the OpenAPI document says it.
ERROR_MEANINGS = {
    400: "The request is invalid: `error.param` names the field at fault.",
    401: "No API key, or one that is not valid (a server started in open mode serves callers on loopback without one).",
    403: "The key may not do this: an admin key is needed, or the pool, team or trace is another's.",
    404: "What the request names does not exist: a model, pool, version, adapter, file, batch or trace.",
    409: "The server's state refuses the request now: another deploy is running, there is no earlier version to "
         "roll back to, the checkpoint cannot be served, the batch cannot be cancelled, the request_id is already "
         "running.",
    413: "The request body (or uploaded file) is larger than this server accepts.",
    429: "A rate limit or quota of the key.",
    502: "The deploy failed on a worker; the pool still serves what it served before.",
    503: "No engine can serve the request now; retry after `Retry-After` seconds.",
    504: "The engine sent nothing within the request timeout.",
}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "api_error")
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """The JSON of every error answer (`APIError.body`), as the OpenAPI document describes it."""

    error: ErrorDetail


def error_responses(*statuses: int) -> dict[int, dict]:
    """A route's `responses=`: the error statuses it can answer, each with the OpenAI error JSON."""
    return {status: {"model": ErrorBody, "description": ERROR_MEANINGS[status]} for status in statuses}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def model_not_found(model_id: str) -> APIError:
    return APIError(404, f"The model `{model_id}` does not exist.", param="model", code="model_not_found")


def unavailable(message: str) -> APIError:
    return APIError(503, message, code="service_unavailable", headers={"Retry-After": "1"})


def from_engine(error: EngineError, request: EngineRequest, prompt_param: str) -> APIError:
    """What the client sees of an engine error (engine/errors.py). `prompt_param`: the client's field that held
    the prompt."""
    if isinstance(error, ContextLengthExceeded):
        return bad_request(
            f"This model's maximum context length is {error.limit} tokens. However, you requested "
            f"{error.requested} tokens ({len(request.prompt_token_ids)} in the prompt, "
            f"{request.max_tokens} for the completion).", param=prompt_param, code="context_length_exceeded")
    if isinstance(error, RequestRejected):
        return APIError(error.status, error.message)
    if isinstance(error, EngineTimeout):
        return APIError(504, error.message)
    if isinstance(error, EngineUnavailable):
        return unavailable(error.message)
    return unavailable(f"the engine could not serve the request: {error.message}")


def not_a_json_object() -> APIError:
    """null, [], 5, "x", or a body sent without Content-Type: application/json."""
    return bad_request("The request body must be a JSON object, sent with Content-Type: application/json.",
                       code="invalid_value")


def internal_error(exc: Exception) -> APIError:
    """A bug's answer. It says the connection closes (the server closes it after a 500), so that a keep-alive
    client does not send its next request on it."""
    return APIError(500, f"Internal error: {type(exc).__name__}", type="api_error", headers={"connection": "close"})


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def _param_from_location(loc: tuple) -> str | None:
    if loc and loc[0] in ("body", "query", "path", "header"):
        loc = loc[1:]  # where the value came from, not part of its name
    parts = [str(p) for p in loc]
    # pydantic reports union members as extra path parts ("str", "list[int]"); drop them.
    parts = [p for p in parts if not any(c in p for c in "[]()") and p not in ("str", "int", "float", "bool")]
    return ".".join(parts) or None


def validation_error(exc: RequestValidationError) -> APIError:
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        return bad_request(f"Malformed JSON in request body: {first.get('ctx', {}).get('error', first.get('msg'))}",
                           code="invalid_json")
    if tuple(first.get("loc", ())) == ("body",) and first.get("type") in ("missing", "model_attributes_type"):
        return not_a_json_object()
    param = _param_from_location(tuple(first.get("loc", ())))
    message = first.get("msg", "invalid value")
    if first.get("type") == "missing":
        message = f"Missing required parameter: '{param}'."
    elif param:
        message = f"Invalid value for '{param}': {message}"
    return bad_request(message, param=param, code="invalid_value" if first.get("type") != "missing" else "missing_required_parameter")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return error_response(validation_error(exc))

    @app.exception_handler(json.JSONDecodeError)
    async def _json(request: Request, exc: json.JSONDecodeError):
        return error_response(bad_request(f"Malformed JSON in request body: {exc}", code="invalid_json"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        headers = {**(exc.headers or {})}
        if exc.status_code == 405:
            headers["Allow"] = _allowed_methods(request)
        return error_response(APIError(exc.status_code, str(exc.detail), headers=headers))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unexpected error serving %s %s", request.method, request.url.path)
        return error_response(internal_error(exc))  # Starlette raises it again; uvicorn closes the connection


def _allowed_methods(request: Request) -> str:
    """Every method the request's path is served with. Starlette's 405 names those of the first route that
    matches the path only, and a path served with GET and POST has a route for each."""
    methods = set()
    for route in request.app.router.routes:
        if route.matches(request.scope)[0] != Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods))
