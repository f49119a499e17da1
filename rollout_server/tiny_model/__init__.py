"""The tiny model the project builds and serves by default: a few-million-parameter Qwen2 (builder.py),
taught to write tool calls by a short CPU training run (training.py)."""
