"""A stand-in trainer for the live-edit tests: it reads the run's live edits at each
"step" exactly as the real trainer does (``EditWatcher.for_role("trainer")``) and prints
what it took, so a test can see an edit reach a running process."""

from __future__ import annotations

import json
import time

from grpo_trainer.live_edits import EditWatcher

watcher = EditWatcher.for_role("trainer")
print("grpo-trainer ready", flush=True)
while True:
    changed = watcher.poll()
    if changed:
        print(f"took {json.dumps(changed, sort_keys=True)}", flush=True)
    time.sleep(0.05)
