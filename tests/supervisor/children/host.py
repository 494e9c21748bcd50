"""Test child: a supervisor process running family.py, for the SIGKILL-the-supervisor test.
Usage: host.py RUN_DIR PIDFILE."""

import asyncio
import sys
from pathlib import Path

from grpo_tui.supervisor.spec import ProcessSpec
from grpo_tui.supervisor.supervisor import Supervisor

run_dir, pidfile = Path(sys.argv[1]), sys.argv[2]
family = Path(__file__).with_name("family.py")
spec = ProcessSpec(name="family", command=[sys.executable, str(family), pidfile])
asyncio.run(Supervisor([spec], run_dir).run())
