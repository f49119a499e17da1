"""The front door's way to a deployment's workers through Dynamo's KV router, run inside the front door.

Dynamo's frontend process is an HTTP server around a preprocessor (chat template, tokenizer), the KV router and a
backend stage that turns token ids into text and applies stop strings. The front door renders and tokenizes every
prompt itself, so for an aggregated deployment routed by KV it calls the same router as a library
(`dynamo._core.KvRouter`) and decodes the text itself (engine/client/choice_text.py): one process and one HTTP
hop fewer for every message of every request. The router finds the workers through the deployment's discovery directory and
follows their KV events as Dynamo's frontend does; where a request goes stays the router's choice.

Two things the library leaves to its caller:
- session affinity: the router library reads no session from a request; `SessionPins` (engine/sessions.py) keeps
  a session on the worker of its first turn, as Dynamo's frontend does;
- the model's end-of-sequence ids: sent as stop ids, and kept among a choice's ids but out of its text, as
  Dynamo's frontend does.

Disaggregated deployments and the round-robin/random router modes keep going through Dynamo's frontend
(engine/client/dynamo_http.py): its prefill router and simple modes are not replaced here.

Rules of this client, beside those of engine/contract.py:
- a choice ended by a stop string ends here, and dropping the stream cancels the rest on the worker;
- the usage's completion tokens count what the client got (up to the stop string), the prompt's what the
  worker last reported.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from contextlib import contextmanager
from pathlib import Path
from typing import AsyncIterator, Iterator

from prometheus_client import CollectorRegistry, Histogram
from tokenizers import Tokenizer

from engine import stream_interval
from engine.client.choice_text import ChoiceText
from engine.contract import (POLICY_LAG, ChoiceDelta, EngineChunk, EngineRequest, EngineUsage, PolicyLag,
                             SampledToken, sampled_tokens, stamp_versions)
from engine.errors import EngineError, EngineTimeout, EngineUnavailable, RefusedBeforeOutput, error_from_dynamo
from engine.ids import WorkerId
from engine.sessions import SessionPins

log = logging.getLogger(__name__)

WORKER_ENDPOINT = "dynamo.backend.generate"  # where dynamo.vllm registers an aggregated worker
FIRST_DISCOVERY_S = 5.0  # how long a new router waits to learn of a first worker

# What the router call costs each request, shown on the front door's /metrics (rollout_server/metrics.py): from
# the call to Dynamo's router until it hands back the chosen worker's stream (choosing the worker by KV overlap
# and load, then sending the request to it), as the front door's event loop sees it.
ROUTER_METRICS = CollectorRegistry()
ROUTER_CALL = Histogram("rollout_router_call_seconds", "Time in Dynamo's KV router call per request (route and "
                        "send, until the worker's stream is open)", registry=ROUTER_METRICS,
                        buckets=(25e-6, 50e-6, 100e-6, 200e-6, 400e-6, 800e-6, 0.0016, 0.0032, 0.0064, 0.0128,
                                 0.0256, 0.0512, 0.1024, 0.2048, 0.4096, 0.8192))


def preprocessed_request(req: EngineRequest, eos_token_ids: list[int], adapter: bool, salted_routing: bool = True) -> dict:
    """The request as Dynamo's router and worker take it (its PreprocessedRequest), from what the front door
    would send Dynamo's frontend. `salted_routing` False: the router hashes the prompt's blocks without the
    request's cache salt (the worker still gets it), to match workers whose KV events carry unsalted hashes."""
    s = req.sampling
    stop_conditions = {"max_tokens": req.max_tokens, "min_tokens": s.min_tokens, "ignore_eos": s.ignore_eos,
                       "stop_token_ids": s.stop_token_ids,
                       "stop_token_ids_hidden": None if s.ignore_eos else eos_token_ids}
    sampling_options = s.sampler_options()
    if req.guided:
        sampling_options["guided_decoding"] = {req.guided.kind: req.guided.spec}
    request = {"model": req.model, "token_ids": req.prompt_token_ids, "stop_conditions": stop_conditions,
               "sampling_options": sampling_options,
               "output_options": {"logprobs": req.top_logprobs if req.logprobs or req.top_logprobs else None},
               "eos_token_ids": eos_token_ids, "routing": {}}
    if req.stream_interval > 1:
        request["annotations"] = [stream_interval.annotation(req.stream_interval)]
    if req.cache_salt:  # the router's block hashes and the worker's cache, each salted
        if salted_routing:
            request["routing"]["cache_salt"] = req.cache_salt
        request["extra_args"] = {"nvext": {"cache_salt": req.cache_salt}}
    if adapter:
        request["routing"]["lora_name"] = req.model
    return request


def _sampled_tokens(out: dict, top_logprobs: int) -> list[SampledToken]:
    alternatives = [[(a["token_id"], a["logprob"]) for a in top] if top else None
                    for top in out.get("top_logprobs") or []] if top_logprobs else ()
    return sampled_tokens(out.get("token_ids") or [], out.get("log_probs"), alternatives, top_logprobs)


def _engine_error(exc: Exception, req: EngineRequest) -> EngineError:
    """An exception from the router or its stream -> the client's error. The worker's refusals carry Dynamo's
    error body (`InvalidRequest: {"message": ..., "code": 400}`), read as the HTTP path reads it; anything else
    is the engine's failure."""
    text = str(exc)
    start = text.find("{")
    try:
        body = json.loads(text[start:]) if start != -1 else None
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("code"), int):
        return error_from_dynamo(body["code"], body, req.model)
    return EngineUnavailable(f"the engine could not serve the request: {text}")


# Where this process's request-plane and response-stream servers bind (engine/supervisor/stack.py, dynamo_env)
PLANE_HOSTS = ("DYN_TCP_RPC_HOST", "DYN_TCP_RESPONSE_STREAM_HOST", "DYN_EVENT_PLANE_HOST")


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Dynamo reads its settings (discovery directory, planes, hosts) from the environment as a runtime starts;
    each deployment's runtime starts with its own."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class EmbeddedRouterClient:
    """The front door's connection to one aggregated deployment, through Dynamo's KV router in this process.

    An `EngineClient` (engine/contract.py), as DynamoFrontendClient is.
    """

    def __init__(self, *, env: dict[str, str], discovery_backend: str, model_dir: Path, served_model_name: str,
                 block_size: int, session_affinity_ttl_s: float, host_cache_hit_weight: float | None = None,
                 timeout_s: float = 600.0, salted_routing: bool = True):
        self.via = f"in-process KV router ({env.get('DYN_FILE_KV') or discovery_backend})"
        self.env = env
        self.discovery_backend = discovery_backend
        self.served_model_name = served_model_name
        self.block_size = block_size
        self.host_cache_hit_weight = host_cache_hit_weight
        self.timeout_s = timeout_s
        self.salted_routing = salted_routing
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.eos_token_ids = _eos_token_ids(model_dir)
        self.pins = SessionPins(session_affinity_ttl_s)
        self._runtime = None
        self._making: asyncio.Task | None = None  # the router of `_loop`, being made or made
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _kv_router(self):
        """The router of the running event loop (Dynamo's runtime is bound to one), made once per loop.

        A new runtime reads the discovery directory in the background: the router is handed out once it knows a
        worker, or after `FIRST_DISCOVERY_S` (then it refuses as it would with no worker), so the first requests
        after a start are not refused for a worker that was there all along."""
        loop = asyncio.get_running_loop()
        if self._making is None or self._loop is not loop:
            self._loop, self._making = loop, loop.create_task(self._make_router(loop))
        making = self._making
        try:
            return await asyncio.shield(making)  # a cancelled request leaves the router to the others
        except Exception:
            if self._making is making:
                self._making = None  # a runtime that failed to start is tried again by the next request
            raise

    async def _make_router(self, loop: asyncio.AbstractEventLoop):
        from dynamo._core import DistributedRuntime, KvRouter, KvRouterConfig

        # The planes' addresses are the same for every deployment (engine.internal_host) and Dynamo reads some of
        # them again later (the response-stream server starts with the first request): they stay set.
        os.environ.update({name: value for name, value in self.env.items() if name in PLANE_HOSTS})
        config = (KvRouterConfig() if self.host_cache_hit_weight is None
                  else KvRouterConfig(host_cache_hit_weight=self.host_cache_hit_weight))
        with _environment(self.env):  # the router's event subscribers read the deployment's broker from it too
            self._runtime = DistributedRuntime(loop, self.discovery_backend, "tcp", event_plane="zmq")
            endpoint = self._runtime.endpoint(WORKER_ENDPOINT)
            router = KvRouter(endpoint, self.block_size, config)
        try:
            await asyncio.wait_for((await endpoint.client()).wait_for_instances(), FIRST_DISCOVERY_S)
            log.info("KV router in the front door: workers found through %s", self.via)
        except TimeoutError:
            log.warning("KV router in the front door: no worker found through %s within %g s", self.via,
                        FIRST_DISCOVERY_S)
        return router

    async def close(self) -> None:
        if self._runtime is not None and self._loop is asyncio.get_running_loop():
            self._runtime.shutdown()
        self._runtime = self._making = self._loop = None

    async def stream_once(self, req: EngineRequest) -> AsyncIterator[EngineChunk]:
        try:
            stream = await self._send(req, self.pins.worker_of(req.session_id))
            async for chunk in self._chunks(stream, req):
                yield chunk
        except RefusedBeforeOutput:
            self.pins.unpin(req.session_id)  # its worker may be gone: a retry is placed afresh
            raise

    async def _send(self, req: EngineRequest, worker_id: int | None):
        request = preprocessed_request(req, self.eos_token_ids, adapter=req.model != self.served_model_name,
                                       salted_routing=self.salted_routing)
        if req.allowed_workers is not None and worker_id not in req.allowed_workers:
            # Dynamo's router places a request on one named worker or chooses among all: a subset is one of them.
            worker_id = random.choice(sorted(req.allowed_workers))
        if worker_id is not None:
            request["routing"]["backend_instance_id"] = worker_id
        try:
            router = await self._kv_router()
            started = time.perf_counter()
            stream = await router.generate_from_request(request)
            ROUTER_CALL.observe(time.perf_counter() - started)
            return stream
        except Exception as exc:
            error = _engine_error(exc, req)
            raise (RefusedBeforeOutput(error) if isinstance(error, EngineUnavailable) else error) from exc

    async def _chunks(self, stream, req: EngineRequest) -> AsyncIterator[EngineChunk]:
        """Dynamo's outputs -> chunks with text; ends (dropping the stream, which cancels what the worker would
        still send) once every choice has finished."""
        n = req.sampling.n
        stop_ids = {*(req.sampling.stop_token_ids or []), *self.eos_token_ids}
        texts = [self._choice_text(req) for _ in range(n)]
        lag = PolicyLag(req.max_policy_lag) if req.max_policy_lag is not None else None
        usage = _Usage(n)
        finished: set[int] = set()
        produced = False
        silence = _Silence(self.timeout_s)
        try:
            while (out := await silence.next(stream)) is not None:
                routing = (out.get("routing_data") or {}).get("worker_id") or {}
                worker = routing.get("decode_worker_id")
                if worker is not None:
                    worker = WorkerId(worker)
                    self.pins.pin(req.session_id, worker)
                if (out.get("index") or 0) in finished:
                    continue  # a choice a stop string ended, still generating
                delta = self._delta(out, req, texts, stop_ids, usage.emitted[out.get("index") or 0], lag)
                produced = produced or bool(delta.tokens)
                if delta.finish_reason:
                    finished.add(delta.index)
                chunk = EngineChunk([delta], usage.add(out, delta), worker, time.monotonic())
                chunk.final = len(finished) == n
                yield chunk
                if chunk.final:
                    return
        except EngineError:
            raise
        except TimeoutError as exc:
            raise EngineTimeout(f"the engine sent nothing for {self.timeout_s:g} s (request_timeout_s)") from exc
        except Exception as exc:
            error = _engine_error(exc, req)
            refused = not produced and isinstance(error, EngineUnavailable)
            raise (RefusedBeforeOutput(error) if refused else error) from exc
        finally:
            silence.close()
        raise EngineUnavailable("the engine's stream ended before the request finished (its worker may have died)")

    def _choice_text(self, req: EngineRequest) -> ChoiceText:
        s = req.sampling
        return ChoiceText(self.tokenizer, s.stop, s.min_tokens or 0, bool(s.include_stop_str_in_output),
                          s.skip_special_tokens is not False)

    def _delta(self, out: dict, req: EngineRequest, texts: list[ChoiceText], stop_ids: set[int],
               first_index: int, lag: PolicyLag | None) -> ChoiceDelta:
        index = out.get("index") or 0
        tokens = _sampled_tokens(out, req.top_logprobs)
        stamp_versions(tokens, first_index, (out.get("engine_data") or {}).get("weight_versions"))
        finish = out.get("finish_reason")
        if finish is not None and finish not in ("stop", "eos", "length", "cancelled"):
            raise EngineUnavailable(f"the engine ended the request: {finish}")
        if lag is not None and (kept := lag.kept(tokens)) < len(tokens):
            tokens, finish = tokens[:kept], POLICY_LAG  # the first token past the budget ends the choice
        ids = [t.token_id for t in tokens]
        if finish not in (None, POLICY_LAG) and ids and ids[-1] in stop_ids:
            ids.pop()  # the stop id (the model's EOS, or one the client named) stays among the ids, not in the text
        step = texts[index].add(ids)
        if step.stopped:
            return ChoiceDelta(index, step.text, tokens[:step.kept], "stop")
        text = step.text + (texts[index].finish() if finish else "")
        # As Dynamo's frontend reports them; a request a deploy cancelled is told apart by the front door
        return ChoiceDelta(index, text, tokens, "stop" if finish in ("eos", "cancelled") else finish)


class _Silence:
    """A request's wait for the engine's next output, given up after `limit_s` (TimeoutError), as the HTTP path's
    read timeout gives it up: one timer per request, re-armed when it fires early, not one per message."""

    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self._loop = asyncio.get_running_loop()
        self._waiting: asyncio.Task | None = None
        self._since = 0.0
        self._expired = False
        self._timer = self._loop.call_later(limit_s, self._check)

    async def next(self, stream) -> dict | None:
        """The stream's next output, None at its end."""
        self._waiting, self._since = asyncio.current_task(), self._loop.time()
        try:
            return await stream.__anext__()
        except StopAsyncIteration:
            return None
        except asyncio.CancelledError:
            if self._expired and self._waiting.uncancel() == 0:
                raise TimeoutError from None
            raise
        finally:
            self._waiting = None

    def close(self) -> None:
        self._timer.cancel()

    def _check(self) -> None:
        now = self._loop.time()
        if self._waiting is not None and now - self._since >= self.limit_s:
            self._expired = True
            self._waiting.cancel()
            return
        self._timer = self._loop.call_at((self._since if self._waiting else now) + self.limit_s, self._check)


class _Usage:
    """The request's usage so far: the prompt's counts as the worker last reported them, the completion's as
    counted here (a choice a stop string ended keeps only its tokens up to it)."""

    def __init__(self, choices: int):
        self.prompt_tokens = self.cached_tokens = 0
        self.emitted = [0] * choices

    def add(self, out: dict, delta: ChoiceDelta) -> EngineUsage:
        reported = out.get("completion_usage")
        if reported:
            self.prompt_tokens = reported.get("prompt_tokens") or 0
            self.cached_tokens = (reported.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        self.emitted[delta.index] += len(delta.tokens)
        return EngineUsage(self.prompt_tokens, sum(self.emitted), self.cached_tokens)


def _eos_token_ids(model_dir: Path) -> list[int]:
    """The model's end-of-sequence ids, from its generation config (else its config), as Dynamo's frontend
    reads them."""
    for name in ("generation_config.json", "config.json"):
        path = model_dir / name
        if path.exists():
            eos = json.loads(path.read_text()).get("eos_token_id")
            if eos is not None:
                return eos if isinstance(eos, list) else [eos]
    return []
