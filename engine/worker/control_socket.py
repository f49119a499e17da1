"""A worker's admin routes, served on its control socket to the front door alone (engine/control_access.py).

Dynamo's vLLM worker registers its admin routes (pause_generation, update_weights_from_disk, load_lora,
control/sleep, ...) on its system port as `POST /engine/<route>`, which every local user can reach, and
Dynamo's system server hands a route the body only (no headers), so a route cannot check its caller. This
worker gives Dynamo's registration a table of its own instead, and serves that table on an HTTP server of its
own, on the Unix socket the supervisor named (`SOCKET_ENV`, in a 0700 directory; the socket itself 0600):
a call without the deployment's token is refused with 401 before any route runs. The system port keeps
/health and /metrics and serves no /engine route.

The routes answer as on Dynamo's system server: the callback's dict as JSON (200), 404 for an unknown route,
400 for a body that is not a JSON object, 500 with the error's message when the callback raises.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Awaitable, Callable

from engine.control_access import SOCKET_ENV, TOKEN_ENV, allowed

log = logging.getLogger("rollout_serve.worker")
Route = Callable[[dict], Awaitable[dict]]
MAX_BODY_BYTES = 64 * 2**20  # a trainer's round lists every tensor it sends (update_weights_from_distributed)
_servers: list[asyncio.Task] = []  # the serving task, held: the loop keeps only a weak reference to a task


class _RouteTable:
    """Takes the place of Dynamo's runtime in the worker's route registration: the routes land here."""

    def __init__(self, runtime):
        self._runtime = runtime
        self.routes: dict[str, Route] = {}

    def register_engine_route(self, name: str, callback: Route) -> None:
        self.routes[name] = callback

    def __getattr__(self, name):  # anything else the registration asks of the runtime
        return getattr(self._runtime, name)


def install() -> None:
    """Moves the worker's admin routes from Dynamo's system port to the control socket."""
    from dynamo.vllm import worker_factory

    path, token = os.environ.get(SOCKET_ENV), os.environ.pop(TOKEN_ENV, None)  # vLLM's engine core needs no token
    if not path or not token:
        raise RuntimeError(f"{SOCKET_ENV} and {TOKEN_ENV} must be set: the supervisor starts workers with them")
    register = worker_factory.WorkerFactory.register_engine_routes

    def register_on_control_socket(self, runtime, *args, **kwargs):
        table = _RouteTable(runtime)
        register(self, table, *args, **kwargs)
        listening = _bind(path)  # here, so that a socket that cannot be made stops the worker's start-up
        serving = asyncio.get_running_loop().create_task(_serve(table.routes, listening, token))
        serving.add_done_callback(_report_failure)
        _servers.append(serving)
        log.info("admin routes on %s: %s", path, ", ".join(sorted(table.routes)))

    worker_factory.WorkerFactory.register_engine_routes = register_on_control_socket


def _report_failure(serving: asyncio.Task) -> None:
    if not serving.cancelled() and serving.exception() is not None:
        log.error("the control socket stopped serving", exc_info=serving.exception())


def _bind(path: str) -> socket.socket:
    if os.path.exists(path):
        os.unlink(path)  # left by this worker's previous run (a restart)
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(path)
    os.chmod(path, 0o600)
    return listening


async def _serve(routes: dict[str, Route], listening: socket.socket, token: str) -> None:
    from aiohttp import web

    async def engine_route(request: web.Request) -> web.Response:
        if not allowed(request.headers.get("Authorization"), token):
            return web.json_response({"status": "error", "message": "missing or wrong control token"}, status=401)
        route = routes.get(request.match_info["route"])
        if route is None:
            return web.json_response({"status": "error", "message": f"no route {request.match_info['route']}"},
                                     status=404)
        try:
            body = await request.json() if request.can_read_body else {}
        except ValueError as exc:
            return web.json_response({"status": "error", "message": f"invalid JSON: {exc}"}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"status": "error", "message": "the body must be a JSON object"}, status=400)
        try:
            return web.json_response(await route(body))
        except Exception as exc:
            log.exception("admin route %s failed", request.match_info["route"])
            return web.json_response({"status": "error", "message": str(exc)}, status=500)

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_route("*", "/engine/{route:.+}", engine_route)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.SockSite(runner, listening).start()
    try:
        await asyncio.Event().wait()  # as long as the worker runs: a runner no one holds is collected, and closes
    finally:
        await runner.cleanup()
