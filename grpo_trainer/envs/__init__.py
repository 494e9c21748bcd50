"""Environments: turn prompts into scored rollout groups for the rollout API."""
