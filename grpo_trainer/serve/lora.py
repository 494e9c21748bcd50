"""LoRA adapters served by name on top of the base model (transformers' peft integration).

Adapters are validated before they touch the model: the directory and its
``adapter_config.json`` must exist, the rank must fit ``--max-lora-rank`` and the adapter
must have been trained on the served base: the same path, or a model of the served model's
shape (after an in-place mode switch or a reload the server serves the trainer's weights,
whose checkpoint path is not the one it started from). The served shape is the loaded
model's own config, not its folder's: the trainer prunes old checkpoints, and a server
started on one must go on taking adapters after it is gone (issue 35: every sync refused
with HTTP 400 once the checkpoint the server started from was pruned). A load that still
fails leaves the server as it was.
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import PreTrainedModel

from grpo_trainer.serve.external import SHAPE_KEYS


class AdapterError(ValueError):
    """An adapter request that cannot be honoured; ``status`` is the HTTP code to answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _shape(config: dict[str, object]) -> dict[str, object]:
    return {key: config.get(key) for key in SHAPE_KEYS}


def _folder_shape(path: Path) -> dict[str, object] | None:
    try:
        return _shape(json.loads((path / "config.json").read_text()))
    except (OSError, ValueError):
        return None


def _same_base(adapter_base: str, served_base: str, served_shape: dict[str, object]) -> bool:
    """Whether an adapter trained on ``adapter_base`` fits the served model (its path and
    the shape of the weights loaded)."""
    if adapter_base == served_base:
        return True
    left, right = Path(adapter_base), Path(served_base)
    if left.exists() and right.exists() and left.resolve() == right.resolve():
        return True
    return _folder_shape(left) == served_shape


class AdapterSet:
    """The adapters loaded into one base model; callers hold the engine lock."""

    def __init__(self, model: PreTrainedModel, *, base_path: str, max_rank: int) -> None:
        self.model = model
        self.base_path = base_path
        self.base_shape = _shape(model.config.to_dict())
        """The loaded model's shape (its folder may be pruned while it is served)."""
        self.max_rank = max_rank
        self.paths: dict[str, str] = {}

    def validate(self, path: str) -> None:
        """Raise ``AdapterError`` unless ``path`` is a LoRA adapter for this base."""
        config_file = Path(path) / "adapter_config.json"
        if not config_file.is_file():
            raise AdapterError(f"no LoRA adapter at {path!r} (adapter_config.json missing)")
        try:
            config = json.loads(config_file.read_text())
        except json.JSONDecodeError as error:
            raise AdapterError(f"unreadable adapter_config.json in {path!r}: {error}") from None
        rank = int(config.get("r", 0))
        if rank > self.max_rank:
            raise AdapterError(f"adapter rank {rank} exceeds --max-lora-rank {self.max_rank}")
        base = str(config.get("base_model_name_or_path") or "")
        if not _same_base(base, self.base_path, self.base_shape):
            raise AdapterError(
                f"adapter {path!r} was trained on base {base!r}, "
                f"but this server serves {self.base_path!r}"
            )

    def load(self, name: str, path: str, *, inplace: bool) -> None:
        """Load ``path`` under ``name``; with ``inplace`` an adapter of that name is replaced."""
        if name in self.paths and not inplace:
            raise AdapterError(f"the lora adapter {name!r} has already been loaded")
        self.validate(path)
        # The name stays in ``paths`` through an in-place swap: requests resolving it
        # meanwhile wait on the engine lock and then see the new adapter, never a 404.
        previous = self.paths.get(name)
        if previous is not None:
            self.model.delete_adapter(name)
        try:
            self.model.load_adapter(path, adapter_name=name)
        except Exception as error:
            if name in self.model.peft_config:
                self.model.delete_adapter(name)
            if previous is not None:
                self.model.load_adapter(previous, adapter_name=name)
            raise AdapterError(f"cannot load adapter {path!r}: {error}") from None
        self.paths[name] = path

    def unload(self, name: str) -> None:
        """Remove the adapter ``name``."""
        if name not in self.paths:
            raise AdapterError(f"the lora adapter {name!r} cannot be found", status=404)
        self.model.delete_adapter(name)
        del self.paths[name]

    def activate(self, name: str | None) -> None:
        """Route the next forward passes through adapter ``name`` (None: the bare base)."""
        if not self.paths:
            return
        if name is None:
            self.model.disable_adapters()
        else:
            self.model.enable_adapters()
            self.model.set_adapter(name)
