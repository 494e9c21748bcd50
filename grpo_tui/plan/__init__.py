"""Profile to process plan: a TOML profile becomes checked process specs for the supervisor.

``profile`` reads and validates the file; ``roles`` turns its role tables into specs;
``placement``, ``cluster`` and ``launchers`` say where each process runs and how it is
launched there; ``sbatch`` wraps a cluster run in a batch script. Torch-free and UI-free:
``grpo-tui check`` goes through here.
"""
