"""Code loaded inside vLLM worker processes: the worker's entry (dynamo_worker.py), the CPU worker extension and
vLLM plugins. Nothing here imports the front door's side of the engine (client/, supervisor/)."""
