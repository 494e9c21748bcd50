"""The weight-sync strategy a trainer's config asks for (``grpo_trainer/sync``, one per mode),
and what the strategy is told about the run. At start (``session.py``) and at an in-place
mode switch (``switch.py``)."""

from __future__ import annotations

from grpo_trainer.control import SupervisorLink
from grpo_trainer.sync.base import SyncContext, WeightSync
from grpo_trainer.train.config import TrainerConfig


def sync_context(config: TrainerConfig) -> SyncContext:
    """What a weight-sync strategy needs to know about the run."""
    return SyncContext(
        inference_url=config.inference_url,
        served_model_name=config.served_model_name,
        checkpoint_dir=config.checkpoint_dir,
        backend=config.inference_backend,
        delta=config.weight_transfer_delta,
        none_reload=config.none_reload,
    )


def make_strategy(config: TrainerConfig, link: SupervisorLink | None) -> WeightSync | None:
    """The strategy of ``--weight-bridge-mode`` (None with ``--sync-every 0``)."""
    if config.sync_every == 0:
        return None
    from grpo_trainer.sync.registry import make_strategy as registry_strategy

    return registry_strategy(config.weight_bridge_mode, sync_context(config), link=link)
