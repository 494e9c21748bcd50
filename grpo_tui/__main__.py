"""``python -m grpo_tui`` runs the ``grpo-tui`` command."""

from grpo_tui.cli import main

main()
