"""Weight updates while requests run, inside each vLLM worker (patches applied by engine/worker/dynamo_worker.py).

Dynamo's `update_weights_from_disk` reloads the weights of a paused worker and resets its prefix cache. An
update in vLLM's pause mode `keep` (requests frozen, not drained) needs three more rules:

1. Every token says which weights sampled it. vLLM's engine core stamps each step's outputs with its weight
   version label and its output processor records, per request, the output index where each label's run
   begins. The update sets the label while the engine is paused, so the first token sampled after the
   resume starts the new run: the boundary is the engine's own. Every message this worker sends carries the
   request's runs so far, `engine_data.weight_versions = [[label, first output index], ...]`. A worker starts
   with the label the supervisor gives it (engine/weight_stamps.py).
2. No request admitted after an update matches a block computed before it. vLLM cannot empty its prefix
   cache while frozen requests hold blocks (the reset is refused), so every request is salted with the
   worker's weights epoch (engine/weight_stamps.py): blocks hashed under another epoch are never matched.
   The epoch moves when a keep-mode pause begins, so requests that arrive at the paused worker (and run
   after the update) are salted apart too. (A pause in wait or abort mode ends with no request holding
   blocks, and the reset after the update empties the cache.) Left open: a request admitted before the
   pause that was still waiting for a batch slot keeps the old salt, and with running_kv "keep" it may
   match a prompt block of the old weights; with "recompute" the cache is emptied and none does.
3. What frozen requests do with the KV they computed under the old weights is the update's `running_kv`:
   - "keep": they continue over it. No recompute; a token after the boundary attends to old-weights KV for
     the tokens before it.
   - "recompute": vLLM preempts them, and they recompute prompt and output so far under the new weights
     before sampling again: the KV of the new policy exactly, for one prefill per running request.
"""

from __future__ import annotations

import contextvars
import logging
import os

from engine.weight_stamps import RUNNING_KV, VERSION_ENV, salted

log = logging.getLogger("rollout_serve.worker")


class _Weights:
    """The worker's weights, as its requests are stamped and salted: one per process (one engine each)."""

    epoch = 0


_runs_of_message: contextvars.ContextVar[list | None] = contextvars.ContextVar("runs_of_message", default=None)


def install() -> None:
    _salt_by_epoch()
    _epoch_at_keep_pause()
    _runs_on_every_output()
    _runs_into_every_message()
    _update_in_flight()


async def label_engine(engine) -> None:
    """Before the worker takes requests: the engine's label is the policy version of the weights it loaded
    (not vLLM's "default")."""
    version = os.environ.get(VERSION_ENV)
    if version is not None:
        await engine.update_weight_version(version)


def _salt_by_epoch() -> None:
    from vllm.v1.engine.async_llm import AsyncLLM

    generate = AsyncLLM.generate

    def generate_salted(self, prompt, *args, **kwargs):
        if _Weights.epoch and isinstance(prompt, dict):
            prompt = {**prompt, "cache_salt": salted(prompt.get("cache_salt"), _Weights.epoch)}
        return generate(self, prompt, *args, **kwargs)

    AsyncLLM.generate = generate_salted


def _epoch_at_keep_pause() -> None:
    from dynamo.vllm import handlers

    pause = handlers.BaseWorkerHandler.pause_generation

    async def pause_generation(self, body: dict) -> dict:
        answer = await pause(self, body)
        if answer.get("status") == "ok" and answer.get("mode") == "keep":
            _Weights.epoch += 1
        return answer

    handlers.BaseWorkerHandler.pause_generation = pause_generation


def _runs_on_every_output() -> None:
    """vLLM attaches a request's version runs to its final output only; every output carries them here."""
    from vllm.v1.engine.output_processor import RequestState

    new_output = RequestState._new_completion_output

    def with_runs(self, *args, **kwargs):
        output = new_output(self, *args, **kwargs)
        if output.weight_versions is None and self.weight_version_starts:
            output.weight_versions = self._weight_version_spans()
        return output

    RequestState._new_completion_output = with_runs


def _runs_into_every_message() -> None:
    """Dynamo's worker builds one message per output and reads the output's logprobs just before sending it
    (`_extract_logprobs`); that read notes the output's runs, and the message leaves with them."""
    from dynamo.vllm import handlers

    extract = handlers.BaseWorkerHandler._extract_logprobs  # a staticmethod: the plain function

    def extract_noting_runs(output, *args, **kwargs):
        spans = getattr(output, "weight_versions", None)
        if spans:
            _runs_of_message.set([[span.version, span.start] for span in spans])
        return extract(output, *args, **kwargs)

    handlers.BaseWorkerHandler._extract_logprobs = staticmethod(extract_noting_runs)
    generate_tokens = handlers.BaseWorkerHandler.generate_tokens

    async def generate_tokens_with_runs(self, *args, **kwargs):
        async for out in generate_tokens(self, *args, **kwargs):
            runs = _runs_of_message.get()
            if runs is not None and isinstance(out, dict) and "token_ids" in out:
                out.setdefault("engine_data", {})["weight_versions"] = runs
                _runs_of_message.set(None)
            yield out

    handlers.BaseWorkerHandler.generate_tokens = generate_tokens_with_runs


def _update_in_flight() -> None:
    """Dynamo's two updates of a paused worker's weights, each followed by rules 1 and 3 (the engine's label,
    and `running_kv`): update_weights_from_disk (reload, reset the prefix cache), and the last step of a
    trainer's broadcast, update_weights_from_distributed calling vLLM's `finish_weight_update`. The worker stays
    paused until the deployer resumes it."""
    from dynamo.vllm import handlers

    handlers.BaseWorkerHandler.update_weights_from_disk = _then_label(handlers.BaseWorkerHandler.update_weights_from_disk)
    handlers.BaseWorkerHandler.update_weights_from_distributed = _then_label(
        handlers.BaseWorkerHandler.update_weights_from_distributed)


def _then_label(update):
    async def update_then_label(self, body: dict) -> dict:
        if not isinstance(body, dict):
            return await update(self, body)
        body = dict(body)
        running_kv = body.pop("running_kv", "keep")  # ours, not Dynamo's: not passed on to vLLM's RPC
        if running_kv not in RUNNING_KV:
            return {"status": "error", "message": f"running_kv must be one of {', '.join(RUNNING_KV)}"}
        answer = await update(self, body)
        if answer.get("status") != "ok" or "weight_version" not in body:
            return answer
        try:
            await self.engine_client.update_weight_version(str(body["weight_version"]))
            if running_kv == "recompute":  # preempts the kept requests, so the cache empties
                await self.engine_client.reset_prefix_cache(reset_running_requests=True)
        except Exception as exc:  # the worker's answer names it
            log.exception("weight update to version %s failed", body["weight_version"])
            return {"status": "error", "message": str(exc)}
        log.info("weights are version %s (epoch %d); kept requests' KV: %s", body["weight_version"], _Weights.epoch,
                 running_kv)
        return answer

    return update_then_label
