"""Rollout API: Atropos-compatible queue of scored rollout groups, durable in SQLite."""
