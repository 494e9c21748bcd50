"""``python -m grpo_trainer.envs --task package.module:TaskClass ...``: run a user's task."""

from grpo_trainer.envs.cli import main

if __name__ == "__main__":
    main()
