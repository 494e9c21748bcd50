#!/usr/bin/env bash
# One device call: install the carried vLLM 0.24.0 bundle and our extra wheels, then run
# benchmarks/gpu_modes.py (every backend x mode, the memory proof, the no-orphan check)
# and, if time is left, benchmarks/trainer_step.py (its GPU line: qwen2.5-0.5b shape, bf16). Everything ends inside 9 minutes.
#
# Before: the vLLM parts in /root/vv/part-* (carried one per call, see docs/gpu.md).
# Call:   run(command="bash benchmarks/gpu_device.sh", carry=[".whl"], timeout_s=600)
# Output ($OUT): gpu_modes.md (table), gpu_modes.json (raw numbers), gpu_diagnostics.md
# (log tails of anything that failed), gpu_runs.tar.gz (profiles, metrics, log tails),
# gpu_device.log (this script's output), trainer_step.txt (when run).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_device.log") 2>&1
TOTAL=${GPU_MODES_TOTAL:-530}   # seconds for this whole script (the call's limit is 600)
WORK=/tmp/gpu_modes_work

source benchmarks/gpu_setup.sh

rm -rf "$WORK"   # ours: a re-run on a warm machine starts clean
budget=$((TOTAL - SECONDS - 40))
echo "gpu_device: gpu_modes.py budget ${budget}s"
timeout -k 10 $((budget + 30)) python3 benchmarks/gpu_modes.py --out "$OUT" --work "$WORK" \
  --budget "$budget" "$@"
status=$?
echo "gpu_device: gpu_modes.py exit $status after ${SECONDS}s"

left=$((TOTAL - SECONDS))
if [ -f benchmarks/trainer_step.py ] && [ "$left" -gt 70 ]; then
  echo "gpu_device: trainer_step.py with ${left}s left"
  timeout -k 5 $((left - 20)) python3 benchmarks/trainer_step.py --shape qwen2.5-0.5b \
    --device cuda --dtype bfloat16 --seq-len 1024 --batch 4 > "$OUT/trainer_step.txt" 2>&1
  echo "gpu_device: trainer_step.py exit $? after ${SECONDS}s"
fi
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
exit $status
