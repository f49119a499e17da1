"""POST /inference/v1/generate: vLLM's token-in/token-out route, in the shape verifiers' train mode reads."""

from __future__ import annotations

from engine.contract import EngineRequest, SampledToken
from engine.ids import new_request_id
from engine.sessions import session_id_for
from rollout_server.auth import Principal
from rollout_server.errors import bad_request
from rollout_server.fast_json import MsgspecJSONResponse
from rollout_server.logprobs import generate_logprobs
from rollout_server.protocol import GenerateRequest
from rollout_server.request_limits import check_session_ids
from rollout_server.serving.context import ServingContext
from rollout_server.serving.finished import policy_versions
from rollout_server.serving.generation import Generation
from rollout_server.serving.prompt_checks import check_prompt
from rollout_server.serving.sampling import sampling_for, stream_interval_for
from rollout_server.structured import guided_for


async def generate(ctx: ServingContext, req: GenerateRequest, session_header: str | None, who: Principal):
    """vLLM's token-in/token-out route, in the shape verifiers' train mode reads."""
    ctx.target(req.model, who)
    if req.stream:
        raise bad_request("streaming is not supported on /inference/v1/generate", param="stream")
    params = req.sampling_params
    check_session_ids(ctx.settings.limits, x_session_id=session_header, **{"sampling_params.user": params.user})
    max_tokens = check_prompt(ctx, req.token_ids, params.max_tokens, "token_ids", "sampling_params.max_tokens")
    guided = await guided_for(ctx.grammars, None, params.structured_outputs, "sampling_params.")
    engine_request = EngineRequest(
        model=req.model, request_id=req.request_id or new_request_id("gen"), prompt_token_ids=list(req.token_ids),
        max_tokens=max_tokens, sampling=sampling_for(ctx, params, max_tokens, "sampling_params."), top_logprobs=params.logprobs or 0,
        guided=guided, cache_salt=params.cache_salt,
        max_policy_lag=params.max_policy_lag, min_policy_version=params.min_policy_version,
        session_id=session_id_for(session_header, None, params.user),
        stream_interval=stream_interval_for(ctx, streamed=False))
    generation = Generation(ctx, engine_request, who=who, endpoint="generate", request_body=req.model_dump(exclude_none=True),
                            prompt_param="token_ids")
    await generation.start()
    choices = await generation.run_to_end()
    body = {
        "request_id": generation.request_id, "model": req.model, "policy_version": generation.policy_version,
        "prompt_token_ids": engine_request.prompt_token_ids,
        "choices": [{
            "index": c.index, "token_ids": c.token_ids, "text": c.text, "finish_reason": c.finish_reason,
            "logprobs": generate_logprobs(c.tokens, params.logprobs or 0),
            "policy_versions": policy_versions(c.tokens), "weight_versions": _weight_versions(c.tokens),
        } for c in choices],
        "usage": generation.usage_dict(), "worker_id": generation.worker_text,
    }
    return MsgspecJSONResponse(body, headers=generation.response_headers())


def _weight_versions(tokens: list[SampledToken]) -> list[dict]:
    """vLLM's per-choice field: [{"version", "start", "end"}] over completion-token indexes."""
    runs = policy_versions(tokens)
    ends = [run["first_token_index"] for run in runs[1:]] + [len(tokens)]
    return [{"version": run["version"], "start": run["first_token_index"], "end": end} for run, end in zip(runs, ends)]
