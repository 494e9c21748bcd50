"""Test child: a leader whose descendants hold its output pipe, as vLLM's engine core holds
the API server's. Starts a grandchild in its process group and one in a session of its own
(``setsid``), both inheriting stdout; writes the three pids to PIDFILE, then waits forever."""

import os
import subprocess
import sys
import time

pidfile = sys.argv[1]
sleeper = [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"]
grandchild = subprocess.Popen(sleeper)
daemon = subprocess.Popen(sleeper, start_new_session=True)
with open(pidfile + ".tmp", "w") as out:
    out.write(f"{os.getpid()}\n{grandchild.pid}\n{daemon.pid}\n")
os.replace(pidfile + ".tmp", pidfile)
print("holder ready", flush=True)
while True:
    time.sleep(1)
