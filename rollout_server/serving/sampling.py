"""A request's sampling fields as the engine takes them, and how many tokens each engine message carries."""

from __future__ import annotations

from engine.contract import SAMPLING_FIELDS, SamplingParams
from rollout_server.errors import bad_request
from rollout_server.protocol import SamplingFields
from rollout_server.request_limits import check_sampled_tokens
from rollout_server.serving.context import ServingContext
from rollout_server.serving.prompt_checks import check_in_vocabulary


def sampling_for(ctx: ServingContext, fields: SamplingFields, max_tokens: int, param_prefix: str = "") -> SamplingParams:
    """The request's sampling fields, checked where they depend on the model or on max_tokens (the engine would
    refuse them with no field named), and n x max_tokens against the server's limit."""
    check_sampled_tokens(ctx.settings.limits, fields.n, max_tokens, f"{param_prefix}max_tokens")
    if fields.min_tokens is not None and fields.min_tokens > max_tokens:
        raise bad_request(f"min_tokens ({fields.min_tokens}) must be at most max_tokens ({max_tokens})",
                          param=f"{param_prefix}min_tokens")
    check_in_vocabulary(ctx, fields.stop_token_ids or [], f"{param_prefix}stop_token_ids")
    return SamplingParams(**{name: getattr(fields, name) for name in SAMPLING_FIELDS})


def stream_interval_for(ctx: ServingContext, streamed: bool, requested: int | None = None) -> int:
    """Tokens per engine message: a streamed response goes at the client's pace (the request's `stream_interval`,
    else the server's); a whole one needs only its end."""
    engine = ctx.settings.engine
    if not streamed:
        return engine.unstreamed_interval
    return requested or engine.stream_interval
