"""Folders of model weights on disk, below ``train`` and ``sync`` (both write them):
``layout`` says what a checkpoint directory holds (torch-free: the plan reads it too),
``full_weights`` writes loadable full weights atomically."""
