"""Test child: after --delay seconds, serve HTTP on --port and print when it started listening."""

import argparse
import http.server
import signal
import sys
import threading
import time

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--delay", type=float, default=0.0)
parser.add_argument("--serve-for", type=float, default=0.0, help="stop listening after (0: never)")
parser.add_argument(
    "--linger-on-term",
    type=float,
    default=None,
    help="on SIGTERM stop listening at once, then exit 0 after this many seconds (as a server "
    "that closes its HTTP side first and takes a while for the rest)",
)
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
if args.linger_on_term is not None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # for sigwait, in every thread
    threading.Thread(target=server.serve_forever, daemon=True).start()
    signal.sigwait({signal.SIGTERM})
    server.shutdown()
    server.server_close()
    print("stopped listening on SIGTERM", flush=True)
    time.sleep(args.linger_on_term)
    sys.exit(0)
server.serve_forever()
sys.exit(0)
