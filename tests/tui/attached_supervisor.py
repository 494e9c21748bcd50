"""A running supervisor in its own process, for ``grpo-tui attach`` tests.

``python attached_supervisor.py RUN_DIR`` supervises the dashboard tests' stand-in stack
(``tui_stack``: inference and trainer, rebuilt in another mode on a switch) as a
``GrpoStack`` with the real role layer's live-edit validation, until SIGTERM, which is its
ordered shutdown.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from tui_stack import respec_for, stack

from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import build_plan
from grpo_tui.stack.stack import GrpoStack
from grpo_tui.supervisor.supervisor import Supervisor

REPO = Path(__file__).resolve().parents[2]


async def main(run_dir: Path) -> int:
    specs = stack()
    plan = build_plan(load_profile(REPO / "profiles" / "quickstart.toml"), run_dir)
    supervisor = Supervisor(specs, run_dir, respec=respec_for(specs))
    GrpoStack(supervisor, editor=plan.edit)  # answers switch_mode and edit on the socket
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(
        signal.SIGTERM, lambda: asyncio.ensure_future(supervisor.shutdown("SIGTERM"))
    )
    outcome = await supervisor.run()
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(asyncio.run(main(Path(sys.argv[1]))))
