#!/usr/bin/env bash
# One device call: vLLM's token guard on a real vLLM (benchmarks/vllm_guard_gpu.py), ~1-2 min.
# Before: the vLLM bundle as for gpu_device.sh (docs/gpu.md); on a warm machine that ran
# gpu_device.sh it is already installed in /tmp/site.
# Call:   run(command="bash benchmarks/vllm_guard_device.sh", carry=[".whl"], timeout_s=420)
# Output ($OUT): vllm_guard.md (one line per check), vllm_guard.log (vLLM's log tail).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
source benchmarks/gpu_setup.sh
timeout -k 10 360 python3 benchmarks/vllm_guard_gpu.py --out "$OUT"
status=$?
tail -c 20000 /tmp/vllm_guard_work/vllm.log > "$OUT/vllm_guard.log" 2>/dev/null
exit $status
