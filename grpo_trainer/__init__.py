"""The GRPO stack grpo-tui supervises: rollout API, inference server, trainer, envs."""
