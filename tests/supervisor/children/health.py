"""Test child: says its own health on the control socket. Failing (the reason from the
command line) at once, ok again on SIGUSR1; prints what it said."""

import json
import os
import signal
import socket
import sys
import time

sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(os.environ["GRPO_TUI_SOCKET"])


def say(ok: bool, reason: str) -> None:
    sock.sendall(json.dumps({"type": "health", "ok": ok, "reason": reason}).encode() + b"\n")
    print(f"said {'ok' if ok else 'failing'}", flush=True)


signal.signal(signal.SIGUSR1, lambda *_: say(True, "recovered"))
say(False, sys.argv[1])
while True:
    time.sleep(1)
