"""The supervisor (runs in the front door's process): starts a deployment's processes (stack.py), reads their
health (health.py), keeps pools healthy and sized (pools.py) and drives a worker's admin routes (worker_control.py)."""
