"""The trainer's ranks: their process group (``group``) and rank 0's plain copy of the
sharded model (``mirror``). Below ``train`` and ``sync``: both act per rank."""
