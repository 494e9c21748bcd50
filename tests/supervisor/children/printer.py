"""Test child: prints a plain line, a 3 MB line, a non-UTF-8 line and a final line with no
newline, in awkward write sizes, then exits 0."""

import sys

out = sys.stdout.buffer
out.write(b"plain line\n")
huge = b"x" * (3 * 1024 * 1024)
for start in range(0, len(huge), 100_000):
    out.write(huge[start : start + 100_000])
    out.flush()
out.write(b"\n")
out.write(b"bin \xff\xfe\x00 end\n")
out.write(b"partial, no newline")
out.flush()
