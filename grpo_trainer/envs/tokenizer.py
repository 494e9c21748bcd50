"""The environment's tokenizer: the model's ``tokenizer.json`` and chat template, no torch.

An environment only encodes prompts and decodes completions, so it loads the fast
tokenizer with the ``tokenizers`` library and renders the chat template with jinja2 (the
same sandboxed renderer transformers uses). That keeps an environment process starting in
well under a second and free of torch's memory; the token ids are the same as
``AutoTokenizer``'s (tested). A model without ``tokenizer.json`` falls back to
transformers' ``AutoTokenizer``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer


class PromptTokenizer(Protocol):
    """What the runner needs from a tokenizer."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def render_chat(self, messages: list[dict[str, str]]) -> str: ...


class FastTokenizer:
    """``tokenizer.json`` through ``tokenizers``, plus the model's chat template."""

    def __init__(self, tokenizer: Tokenizer, chat_template: str | None, special: dict[str, str]):
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.special = special

    @classmethod
    def from_dir(cls, path: Path) -> FastTokenizer:
        """Load from a model directory holding ``tokenizer.json``."""
        config_file = path / "tokenizer_config.json"
        config: dict[str, Any] = json.loads(config_file.read_text()) if config_file.exists() else {}
        template_file = path / "chat_template.jinja"
        template = template_file.read_text() if template_file.exists() else None
        template = template or config.get("chat_template")
        special = {k: v for k, v in config.items() if k.endswith("_token") and isinstance(v, str)}
        file = path / "tokenizer.json"
        try:
            tokenizer = Tokenizer.from_file(str(file))
        except Exception as exc:  # the tokenizers library raises a bare Exception
            raise ValueError(f"{file}: the tokenizers library cannot read it: {exc}") from exc
        return cls(tokenizer, template, special)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template; give the prompt as text")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=True, **self.special
        )


class HfTokenizer:
    """Fallback through transformers for models that ship no ``tokenizer.json``."""

    def __init__(self, name_or_path: str) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(name_or_path)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )


def load_prompt_tokenizer(name_or_path: str) -> PromptTokenizer:
    """A local model directory with ``tokenizer.json`` loads fast; anything else via HF."""
    path = Path(name_or_path)
    if (path / "tokenizer.json").is_file():
        return FastTokenizer.from_dir(path)
    if not path.exists():
        from huggingface_hub import snapshot_download
        from huggingface_hub.utils import (
            HFValidationError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        try:
            local = snapshot_download(
                name_or_path,
                allow_patterns=["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"],
            )
        except (
            HFValidationError,  # not a repo id (a mistyped local path)
            LocalEntryNotFoundError,  # no hub access, and not in the cache
            RepositoryNotFoundError,  # no such repo, or gated
            RevisionNotFoundError,
        ):
            return HfTokenizer(name_or_path)  # transformers says why, in its words
        if (Path(local) / "tokenizer.json").is_file():
            return FastTokenizer.from_dir(Path(local))
    return HfTokenizer(name_or_path)


def _raise(message: str) -> None:
    raise ValueError(message)
