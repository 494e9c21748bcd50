"""Test child: a process tree to clean up. Writes the pids of itself, a child, a grandchild and
a grandchild that left the session (setsid) to PIDFILE, one per line, then waits forever."""

import os
import subprocess
import sys
import time

pidfile = sys.argv[1]
sleeper = [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"]
child_code = (
    "import subprocess, sys, time\n"
    f"g = subprocess.Popen({sleeper!r})\n"
    f"d = subprocess.Popen({sleeper!r}, start_new_session=True)\n"
    "print(g.pid, d.pid, flush=True)\n"
    "while True: time.sleep(1)\n"
)
child = subprocess.Popen([sys.executable, "-c", child_code], stdout=subprocess.PIPE, text=True)
grandchild, daemon = child.stdout.readline().split()
with open(pidfile + ".tmp", "w") as out:
    out.write(f"{os.getpid()}\n{child.pid}\n{grandchild}\n{daemon}\n")
os.replace(pidfile + ".tmp", pidfile)
print("family ready", flush=True)
while True:
    time.sleep(1)
