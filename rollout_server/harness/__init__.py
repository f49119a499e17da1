"""Real stacks and checkpoints for tests and benchmarks (not served): `stack.start_stack` runs `rollout-serve up`."""
