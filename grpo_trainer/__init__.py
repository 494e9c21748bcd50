"""The GRPO training stack that grpo-tui supervises: API, inference server, trainer, environments."""
