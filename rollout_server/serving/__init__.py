"""One request's way through the engine, shared by chat, completions and generate (rollout_server/chat.py, ...).

    context.py          ServingContext: what every request needs, built once by the app
    prompt_checks.py    the prompt against the vocabulary and the context window (400s naming the field)
    sampling.py         the request's sampling fields -> the engine's SamplingParams; tokens per engine message
    generation.py       Generation: sends one engine request, times and accumulates its choices
    team_scope.py       TeamScope: each team's KV cache salt, its sessions and request ids, kept apart from others'
    streamed_answer.py  a streamed response's server-sent events, the stream's end in the last write
    finished.py         FinishedGeneration: what the metrics, usage, quotas and traces are built from
"""
