"""Profile to process plan: a TOML profile becomes checked process specs for the supervisor.

A pipeline of values. ``profile`` reads and validates the file (``toml_keys`` names each
key and its line; ``process_tables`` checks the ``[process.*]`` tables and the graph of
every process); ``checks`` reads its role tables into ``settings`` (one immutable value,
with every problem found); ``topology`` says where each role runs in a weight-sync mode
(``placement`` for GPUs, ``cluster`` for Slurm nodes, ``launchers`` for local, torchrun
and srun); ``specs`` builds one process spec per role from those and the run's
``overrides`` (mode, served model, restart arguments, live edits); ``roles`` ties them
into the ``Plan`` the supervisor calls back for respecs and edits. ``sbatch`` wraps a
cluster run in a batch script. Torch-free and UI-free: ``grpo-tui check`` goes through here.
"""
