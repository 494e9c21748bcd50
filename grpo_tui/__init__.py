"""grpo-tui: supervise and watch GRPO training runs."""
