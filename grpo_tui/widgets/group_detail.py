"""One recorded group in full: its facts, the prompt, a row per completion, and the chosen
completion token by token, coloured by a measure (``grpo_tui/rollout_view.py``)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from grpo_trainer.records.rollouts import GroupRecord
from grpo_tui.rollout_view import completion_tokens, completions_table, group_title, legend


class GroupDetail(VerticalScroll):
    """Drawn by :meth:`show`; focus it (tab) to scroll a long completion with the arrows."""

    DEFAULT_CSS = """
    GroupDetail {
        padding: 0 1;
        #group-prompt { color: $text-muted; max-height: 4; }
        #group-completions { margin: 1 0; }
        #group-tokens-title { color: $text-muted; }
        #group-legend { margin-top: 1; }
    }
    """

    def compose(self) -> ComposeResult:
        yield Static(id="group-title")
        yield Static(id="group-prompt")
        yield Static(id="group-completions")
        yield Static(id="group-tokens-title")
        yield Static(id="group-tokens")
        yield Static(id="group-legend")

    def show(self, record: GroupRecord | None, selected: int, measure: str, note: str = "") -> None:
        """Draw ``record`` with completion ``selected`` open (``note`` when there is none)."""
        with self.app.batch_update():
            self._show(record, selected, measure, note)

    def _show(self, record: GroupRecord | None, selected: int, measure: str, note: str) -> None:
        parts = ("title", "prompt", "completions", "tokens-title", "tokens", "legend")
        statics = {name: self.query_one(f"#group-{name}", Static) for name in parts}
        if record is None:
            for name, static in statics.items():
                static.update(Text(note, style="italic") if name == "title" else "")
            return
        completion = record.completions[selected]
        statics["title"].update(group_title(record))
        statics["prompt"].update(Text.assemble(("prompt ", "bold"), record.prompt_text))
        statics["completions"].update(completions_table(record, selected))
        statics["tokens-title"].update(
            f"completion #{completion.index}: {completion.length} tokens (←/→ another, c colours)"
        )
        statics["tokens"].update(completion_tokens(record, completion, measure))
        statics["legend"].update(legend(measure, record))
