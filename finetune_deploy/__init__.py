"""Deploying fine-tuned checkpoints: validation, policy versions, rollout plans (see docs/deploy.md)."""
