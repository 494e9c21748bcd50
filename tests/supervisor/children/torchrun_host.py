"""Test child: a supervisor running a 2-rank torchrun group of ranks.py, built by the real
launcher, for the SIGKILL-the-supervisor test. Usage: torchrun_host.py RUN_DIR STATE_DIR."""

import asyncio
import sys
from pathlib import Path

from grpo_tui.plan.launchers import Launch, Placement, Torchrun
from grpo_tui.supervisor.spec import ProcessSpec
from grpo_tui.supervisor.supervisor import Supervisor

run_dir, state = Path(sys.argv[1]), sys.argv[2]
ranks = Path(__file__).with_name("ranks.py")
launch = Torchrun(log_dir=run_dir / "ranks", shutdown_timeout=30).wrap(
    Launch(argv=[sys.executable, str(ranks), state]), Placement(ranks=2)
)
spec = ProcessSpec(name="trainer", command=launch.argv, env=launch.env)
asyncio.run(Supervisor([spec], run_dir).run())
