"""Test child: after --delay seconds, serve HTTP on --port and print when it started listening."""

import argparse
import http.server
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--delay", type=float, default=0.0)
parser.add_argument("--serve-for", type=float, default=0.0, help="stop listening after (0: never)")
args = parser.parse_args()


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *_: object) -> None:
        pass


time.sleep(args.delay)
server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Health)
print(f"listening at {time.time():.6f}", flush=True)
if args.serve_for:
    server.timeout = 0.05
    deadline = time.monotonic() + args.serve_for
    while time.monotonic() < deadline:
        server.handle_request()
    server.server_close()
    print("stopped listening", flush=True)
    while True:
        time.sleep(1)
server.serve_forever()
sys.exit(0)
