#!/usr/bin/env bash
# One device call (kind nvidia-h200): benchmarks/attach_gpu.py, issue 37's GPU numbers:
# runs attached to a warm vLLM kept by `grpo-tui serve` (first step, 5-step reward 0.8
# from the command), then a 4-cell sweep on one kept server against four cells with their
# own, then a cold run if time is left; everything inside GPU_TOTAL (default 560 s).
# Before: the vLLM parts in /root/vv/part-* (docs/gpu.md); .whl (tomli_w) carried.
# Call:   run(command="bash benchmarks/attach_gpu_device.sh", carry=[".whl"],
#             kind="nvidia-h200", timeout_s=600)
# Dry run here (CPU, the built-in server): GPU_CPU_CHECK=1 bash benchmarks/attach_gpu_device.sh
# Out:    attach_gpu.md (the tables), attach_gpu.log (console), all.tar.gz (JSON, profiles,
#         consoles, run logs): copy attach_gpu.md to benchmarks/results/attach_gpu.md.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/attach_gpu.log") 2>&1
TOTAL=${GPU_TOTAL:-560}
source benchmarks/gpu_setup.sh
cpu=()
[ "${GPU_CPU_CHECK:-0}" = 1 ] && cpu=(--cpu)
timeout -k 10 $((TOTAL - SECONDS - 20)) python3 benchmarks/attach_gpu.py --out "$OUT" \
  --budget $((TOTAL - SECONDS - 45)) "${cpu[@]}"
status=$?
command -v nvidia-smi >/dev/null && nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
(
  cd "$OUT" || exit
  find . \( -name '*.safetensors' -o -name 'rollouts.db*' -o -name 'checkpoints' -o -name 'shared_weights' \) \
    -prune -exec rm -rf {} +
  find . -mindepth 2 -type f -size +4M -print -delete
  tar czf /tmp/attach_all.tar.gz --exclude=attach_gpu.log --exclude=attach_gpu.md --exclude=attach_gpu.json .
  rm -rf -- work-attach/
  mv /tmp/attach_all.tar.gz all.tar.gz
)
ls -la "$OUT"
exit $status
