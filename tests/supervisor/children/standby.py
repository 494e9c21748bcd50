"""A standby-capable child: says it loaded (and, with ``PID_DIR`` set, leaves a file named by
its pid there), waits at its start gate for a command, then says it started with the
arguments it runs with and lives until stopped (``exit N`` among them: it exits N right away
instead). With ``TERM_DELAY`` set, SIGTERM ends it that many seconds later (a slow stop)."""

import json
import os
import signal
import sys
import time
from pathlib import Path

from grpo_trainer.start_gate import wait_for_command

if "TERM_DELAY" in os.environ:
    delay = float(os.environ["TERM_DELAY"])
    signal.signal(signal.SIGTERM, lambda *_: (time.sleep(delay), sys.exit(0)))
print(f"loaded {os.getpid()}", flush=True)
if "PID_DIR" in os.environ:
    (Path(os.environ["PID_DIR"]) / str(os.getpid())).touch()
handed = wait_for_command()
args = sys.argv[1:] if handed is None else handed
print(f"started {os.getpid()} {json.dumps(args)}", flush=True)
if "exit" in args:
    sys.exit(int(args[args.index("exit") + 1]))
while True:
    time.sleep(1)
