"""The GRPO trainer: config, data, loss, loop, checkpoints, metrics reporting."""
