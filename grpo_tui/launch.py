"""The dashboard's entry points: build what the app draws, run it, and say how it ended.

``grpo-tui [PROFILE]`` (:func:`run_app`; ``grpo-tui serve``: :func:`run_plan_app`): a new
run directory, its stack (and its ``[run] notify`` command), the app over it; once the app
exits, the terminal shows what ``grpo-tui run`` shows
(:class:`grpo_tui.run_summary.RunSummary`): how the run ended, the steps done and the last
reward, the run directory and the commands to view and report it.
``grpo-tui attach`` (:func:`run_attach`) follows a running run's files; ``grpo-tui view``
(:func:`run_view`) opens a finished one read-only. A bad keymap stops each before anything
starts (exit 2).
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from grpo_tui.app import GrpoTuiApp, binding_ids
from grpo_tui.keymap import KeymapError, default_keymap_path, read_keymap
from grpo_tui.plan.profile import Profile
from grpo_tui.plan.roles import Plan
from grpo_tui.run_state import RunState
from grpo_tui.run_summary import RunSummary
from grpo_tui.supervisor.events import Notice

EXIT_BAD_INPUT = 2


def keymap_ok() -> bool:
    """Check the user's keymap before anything starts; print the problems if it is bad."""
    try:
        read_keymap(default_keymap_path(), binding_ids())
    except KeymapError as error:
        print(f"error: {error}", file=sys.stderr)
        return False
    return True


def run_app(profile: Path | str | Profile, mode: str | None = None) -> int:
    """Open the dashboard on a profile (a path or a loaded profile), then print the run's
    summary; returns the exit code."""
    from grpo_tui.plan.profile import load_profile
    from grpo_tui.plan.roles import build_plan

    if not keymap_ok():
        return EXIT_BAD_INPUT
    loaded = load_profile(profile, mode=mode) if isinstance(profile, str | Path) else profile
    return run_plan_app(build_plan(loaded))


def run_plan_app(plan: Plan, notice: str = "") -> int:
    """Open the dashboard on a checked plan (``grpo-tui serve``'s: inference alone, with the
    URL to attach to as its ``notice``), then print the run's summary; returns the exit
    code."""
    from grpo_tui.headless import write_run_dir
    from grpo_tui.notify import Notifier
    from grpo_tui.stack.stack import GrpoStack

    if not keymap_ok():
        return EXIT_BAD_INPUT
    write_run_dir(plan)
    stack = GrpoStack.from_plan(plan)
    state = RunState(plan.run_dir.name, mode=plan.roles.mode, run_dir=plan.run_dir)
    notify = plan.profile.run.notify
    notifier = Notifier(notify, stack.supervisor, plan.run_dir.name) if notify else None
    app = GrpoTuiApp(state, stack=stack, notice=notice, notifier=notifier)
    result = app.run()
    code = result if result is not None else app.return_code or 0
    summary(app).print(Console(highlight=False, soft_wrap=True))
    return code


def summary(app: GrpoTuiApp) -> RunSummary:
    """What ``grpo-tui run`` prints at its end, for the run the app supervised."""
    assert app.supervisor is not None
    state, outcome = app.state, app.outcome
    return RunSummary(
        app.supervisor.run_dir,
        outcome.exit_code if outcome is not None else app.return_code or 0,
        outcome.reason if outcome is not None else "the dashboard closed",
        app.supervisor.status(),
        step=state.step(),
        total_steps=state.total_steps(),
        reward=state.metrics.latest.get("reward/mean"),
        notify_problems=app.notifier.problems if app.notifier is not None else (),
    )


def attach_app(run_dir: Path, *, keymap_path: Path | None = None) -> GrpoTuiApp:
    """The dashboard over a running run's files, following them (``grpo-tui attach``), with
    its actions on the supervisor's control socket when it answers, else read-only."""
    from grpo_tui.attach import attach_control
    from grpo_tui.run_files import RunFollower, profile_mode

    state = RunState(run_dir.name, mode=profile_mode(run_dir / "profile.toml"), run_dir=run_dir)
    follower = RunFollower(run_dir, state)
    follower.poll()
    control, why = attach_control(run_dir)
    notice = why or "actions go to the running supervisor; q leaves the run running"
    return GrpoTuiApp(
        state, control=control, follow=follower.poll, notice=notice, keymap_path=keymap_path
    )


def run_attach(run_dir: Path) -> int:
    """``grpo-tui attach``'s dashboard (:func:`attach_app`); returns 0 (2 for a bad keymap)."""
    from grpo_tui.attach import AttachedControl

    if not keymap_ok():
        return EXIT_BAD_INPUT
    app = attach_app(run_dir)
    try:
        app.run()
    finally:
        if isinstance(app.control, AttachedControl):
            app.control.close()
    return 0


def run_view(run_dir: Path | str) -> int:
    """Open a run directory read-only; returns 0 (2 for a bad keymap)."""
    from grpo_tui.run_files import load_run

    if not keymap_ok():
        return EXIT_BAD_INPUT
    state, bad_lines = load_run(Path(run_dir))
    if bad_lines:
        state.apply(Notice(level="warning", message=f"{bad_lines} unreadable JSON lines skipped"))
    GrpoTuiApp(state).run()
    return 0
