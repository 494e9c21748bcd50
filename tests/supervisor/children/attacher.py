"""Test child: the attach (or, with --detach, detach) command of an external process.

It asks ``URL/health`` once; it appends what it did to RECORD and prints it: ``attached to
URL`` (the readiness line) and exit 0, ``unreachable`` and exit 1, or ``detached``."""

import argparse
import sys
import urllib.error
import urllib.request

parser = argparse.ArgumentParser()
parser.add_argument("url")
parser.add_argument("record")
parser.add_argument("--detach", action="store_true")
args = parser.parse_args()


def record(line: str) -> None:
    with open(args.record, "a") as out:
        out.write(line + "\n")
    print(line, flush=True)


if args.detach:
    record("detached")
    sys.exit(0)
try:
    urllib.request.urlopen(f"{args.url}/health", timeout=2).read()
except (urllib.error.URLError, OSError) as error:
    record(f"unreachable: {error}")
    sys.exit(1)
record(f"attached to {args.url}")
