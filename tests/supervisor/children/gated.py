"""A prestart child: says it loaded, touches MARKER, waits at the start gate, says it started."""

import sys
import time
from pathlib import Path

from grpo_trainer.start_gate import wait_for_start

print(f"loaded {time.time()}", flush=True)
Path(sys.argv[1]).touch()
wait_for_start()
print(f"started {time.time()}", flush=True)
