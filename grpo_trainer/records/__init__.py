"""What the run trained on and where its time went, recorded for the inspector and timeline.

Append-only files under the run directory, one writer per file (processes may run on other
nodes over a shared file system, where cross-process SQLite locking is not safe), written
by a background thread and bounded in size: ``rollouts/`` (each group the trainer trained
on, each all-equal group an environment dropped) and ``timeline/`` (per-step phase spans).
Torch-free: the dashboard reads these with the same modules.
"""
