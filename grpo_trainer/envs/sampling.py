"""What an environment asks inference for: the prompt's tokens and the sampling settings,
live-edited (``grpo_trainer.live_edits``) from the next group on."""

from __future__ import annotations

import httpx

from grpo_trainer.envs.inference import Sample, SamplingRequest, complete
from grpo_trainer.envs.settings import EnvSettings
from grpo_trainer.envs.stats import Reporter
from grpo_trainer.envs.task import Prompt
from grpo_trainer.envs.tokenizer import PromptTokenizer
from grpo_trainer.live_edits import EditWatcher


class Sampling:
    """Encodes prompts and samples their completions with the settings in force."""

    def __init__(
        self,
        settings: EnvSettings,
        tokenizer: PromptTokenizer,
        inference: httpx.AsyncClient,
        max_tokens: int,
        reporter: Reporter,
    ) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.inference = inference
        self.max_tokens = max_tokens
        self.reporter = reporter
        self.edits = EditWatcher.for_role("env")

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt: chat template for ``messages``, plain text otherwise."""
        if prompt.messages:
            return self.tokenizer.encode(self.tokenizer.render_chat(list(prompt.messages)))
        return self.tokenizer.encode(prompt.text)

    def request(self, n: int, model: str | None = None) -> SamplingRequest:
        """``n`` completions of ``model`` (default: our served name) as settings say now."""
        settings = self.settings
        return SamplingRequest(
            model=model or settings.model_name,
            n=n,
            max_tokens=self.max_tokens,
            temperature=settings.temperature,
            top_p=settings.top_p,
            ignore_eos=settings.ignore_eos,
            copies=settings.prompt_copies,
        )

    async def sample(
        self, prompts: list[list[int]], request: SamplingRequest
    ) -> list[list[Sample]]:
        """The completions of each prompt, in one request (``inference.complete``: raises
        on errors and garbage)."""
        return await complete(self.inference, prompts, request)

    def take_edits(self) -> None:
        """The run's live edits from the next group on; the supervisor validated them with
        these settings' own model."""
        changed = self.edits.poll()
        if not changed:
            return
        new = {k: v for k, v in changed.items() if getattr(self.settings, k) != v}
        if new:
            changes = ", ".join(f"{k} {getattr(self.settings, k)} -> {v}" for k, v in new.items())
            self.settings = self.settings.model_copy(update=new)
            self.reporter.event(f"live edit from the next group: {changes}")
