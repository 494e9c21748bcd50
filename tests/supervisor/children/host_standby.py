"""Test child: a supervisor running standby.py as a standby process, for the
SIGKILL-the-supervisor test. Usage: host_standby.py RUN_DIR PID_DIR."""

import asyncio
import sys
from pathlib import Path

from grpo_tui.supervisor.spec import LogLineProbe, ProcessSpec
from grpo_tui.supervisor.supervisor import Supervisor

run_dir, pid_dir = Path(sys.argv[1]), sys.argv[2]
command = [sys.executable, str(Path(__file__).with_name("standby.py")), "run"]
spec = ProcessSpec(
    name="server",
    command=command,
    env={"PID_DIR": pid_dir},
    prestart=True,
    standby=True,
    readiness=LogLineProbe(pattern="^started ", period=0.05),
)
asyncio.run(Supervisor([spec], run_dir).run())
