"""The ``grpo-tui`` command group: its default command, the options several commands share,
and how a command fails on bad input (exit 2, one line per problem, nothing started)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import click
import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from grpo_tui.plan.profile import ProfileError

EXIT_BAD_INPUT = 2
DEFAULT_COMMAND = "tui"


class DefaultToTui(TyperGroup):
    """``grpo-tui [PROFILE] [--mode M]`` means ``grpo-tui tui ...``: a default command.

    A first word that is neither a command nor a profile (a bare word naming no file) is a
    mistyped command: it goes to the group, which names it with the nearest command ("No
    such command 'chek'. Did you mean 'check'?", exit 2) instead of reaching the dashboard
    as a stray argument.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        group_flags = {"--help", "-h", "--install-completion", "--show-completion"}
        first = args[0] if args else None
        if first is None or (
            first not in self.commands
            and first not in group_flags
            and not _looks_like_command(first)
        ):
            args = [DEFAULT_COMMAND, *args]
        return super().parse_args(ctx, args)


def _looks_like_command(word: str) -> bool:
    """A bare word that names no file: what a mistyped command looks like."""
    if word.startswith("-") or "/" in word or "." in word:
        return False
    return not Path(word).exists()


app = typer.Typer(
    cls=DefaultToTui,
    help="Supervise GRPO training: dashboard, headless runs, profile checks.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)


ModeOption = Annotated[
    str | None,
    typer.Option(
        "--mode",
        help=(
            "Weight-sync mode, overriding run.mode: none, shared_vllm, lora_only, "
            "lora_restart, colocate."
        ),
    ),
]


InferenceUrlOption = Annotated[
    str | None,
    typer.Option(
        "--inference-url",
        help=(
            "Attach to the inference server running at this URL (vLLM, SGLang or `grpo-tui "
            "serve`'s) instead of starting one; sets inference.url."
        ),
    ),
]


ThresholdOption = Annotated[
    float,
    typer.Option("--threshold", help="Reward (5-step mean of reward/mean) to time each run to."),
]


def err_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def fail(error: ProfileError) -> typer.Exit:
    console = err_console()
    count = len(error.problems)
    for problem in sorted(error.problems, key=lambda p: (p.file, p.line or 0)):
        console.print(f"[bold red]error[/] {escape(str(problem))}", soft_wrap=True)
    console.print(f"{count} problem{'s' if count != 1 else ''}; nothing was started.")
    return typer.Exit(EXIT_BAD_INPUT)


def require_path(path: Path) -> None:
    """Exit 2 saying ``not found`` for a run or sweep directory that does not exist (it
    was told "no recorded groups (rollouts/)" or "not a run directory")."""
    if not path.exists():
        err_console().print(f"[bold red]error[/] {escape(str(path))}: not found")
        raise typer.Exit(EXIT_BAD_INPUT)
