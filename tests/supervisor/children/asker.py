"""Test child: on SIGTERM, asks the supervisor to restart the process with role ROLE over the
control socket (as the trainer does in mode none), prints the reply, then exits 0."""

import json
import os
import signal
import socket
import sys
import time

role = sys.argv[1]
asked = False


def on_term(*_: object) -> None:
    global asked
    asked = True


signal.signal(signal.SIGTERM, on_term)
print("asker ready", flush=True)
while not asked:
    time.sleep(0.02)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(15)
sock.connect(os.environ["GRPO_TUI_SOCKET"])
request = {"type": "request", "id": "r1", "action": "restart", "role": role}
sock.sendall(json.dumps(request).encode() + b"\n")
reply = sock.makefile("rb").readline().decode().strip()
print("reply", reply, flush=True)
