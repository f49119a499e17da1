"""How many tokens a worker gathers before it sends them on, chosen per request by the front door.

vLLM takes this per request (`SamplingParams.stream_interval`; the first token always goes alone),
but Dynamo 1.6.1's frontend has no field that carries it to the worker. It does forward `nvext`
annotations (opaque strings) to the worker, so the front door writes the interval as one, and our
worker (engine/worker/dynamo_worker.py) sets it on the request's sampling parameters.
"""

from __future__ import annotations

import functools

_PREFIX = "rollout-serve:stream-interval="


def annotation(interval: int) -> str:
    return f"{_PREFIX}{interval}"


def from_annotations(annotations: list[str] | None) -> int | None:
    for entry in annotations or []:
        if entry.startswith(_PREFIX):
            return max(1, int(entry[len(_PREFIX):]))
    return None


def honouring_annotation(build_sampling_params):
    """Wraps Dynamo's build_sampling_params(request, ...) to apply the request's interval annotation."""
    @functools.wraps(build_sampling_params)
    def build(request, *args, **kwargs):
        params = build_sampling_params(request, *args, **kwargs)
        interval = from_annotations(request.get("annotations"))
        if interval is not None:
            params.stream_interval = interval
        return params

    return build
