"""The ``grpo-tui`` command: dashboard (default), run, check, view, samples, sweep, report.

``check`` and ``run`` never import textual (nor torch): the dashboard and the viewer are
imported only when asked for. Bad profiles exit 2 with one line per problem.

One module per group of commands (``start``, ``serve``, ``runs``, ``sweep``); ``group`` holds the
command group and the options they share, ``loading`` how a profile becomes a plan,
``plan_text`` the plan as ``check`` prints it.
"""

# Each module registers its commands on `app` as it is imported, and `--help` lists them in
# that order: start (tui, check, run, sbatch), serve, runs (attach, view, samples, edit), sweep.
from grpo_tui.cli import start  # noqa: I001
from grpo_tui.cli import serve
from grpo_tui.cli import runs
from grpo_tui.cli import sweep
from grpo_tui.cli.group import app

__all__ = ["app", "main", "runs", "serve", "start", "sweep"]


def main() -> None:
    """Entry point of the ``grpo-tui`` script."""
    app()
