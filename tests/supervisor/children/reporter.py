"""Test child: speaks the control-socket protocol. Sends two metrics records, an event, then
each request given as JSON on the command line, printing every reply; then waits."""

import json
import os
import socket
import sys
import time

sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(os.environ["GRPO_TUI_SOCKET"])
stream = sock.makefile("rwb")


def send(record: dict) -> None:
    stream.write(json.dumps(record).encode() + b"\n")
    stream.flush()


send({"type": "metrics", "step": 1, "t": time.time(), "data": {"loss": 0.5, "kl": None}})
send({"type": "metrics", "step": 2, "t": time.time(), "data": {"loss": 0.25}})
stream.write(b"this is not json\n")
stream.flush()
send({"type": "event", "t": time.time(), "level": "warning", "message": "hello from reporter"})
for raw in sys.argv[1:]:
    send(json.loads(raw))
    print("reply", stream.readline().decode().strip(), flush=True)
print("reporter done", flush=True)
while True:
    time.sleep(1)
