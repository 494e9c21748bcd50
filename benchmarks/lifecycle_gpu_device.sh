#!/usr/bin/env bash
# One device call (kind nvidia-h100-x2 or nvidia-h200-x2; two GPUs, one lane each):
# benchmarks/lifecycle_gpu.py, issue 26 before and after: start-up by phase, each mode's
# seconds to a 5-step reward of 0.8, each mode switch, one lora_restart restart. Everything
# inside GPU_TOTAL (default 570 s; the call's limit is 600).
# Before: the vLLM parts in /root/vv/part-* (docs/gpu.md); .whl (tomli_w) carried.
# Call:   run(command="bash benchmarks/lifecycle_gpu_device.sh", carry=[".whl"],
#             kind="nvidia-h100-x2", timeout_s=600)
# Extra arguments go to lifecycle_gpu.py, e.g. --before-set inference.KEY=true (the
# restart-based none / switch of the before arm) or --lane "0=after/shared_vllm" (one GPU).
# Out:    lifecycle_gpu.md (the tables), lifecycle_gpu.json (every number, rewritten after
#         each cell), lifecycle_gpu.log (console), all.tar.gz (profiles, events, metrics, logs).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/lifecycle_gpu.log") 2>&1
TOTAL=${GPU_TOTAL:-570}
source benchmarks/gpu_setup.sh
timeout -k 10 $((TOTAL - SECONDS - 20)) python3 benchmarks/lifecycle_gpu.py --out "$OUT" \
  --budget $((TOTAL - SECONDS - 45)) "$@"
status=$?
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
(
  cd "$OUT" || exit
  find work-lifecycle \( -name '*.safetensors' -o -name 'rollouts.db*' -o -name 'checkpoints' \
    -o -name 'cache-*' -o -name 'vllm-cache-*' -o -name 'model' \) -prune -exec rm -rf {} +
  find work-lifecycle -type f -size +4M -name '*.log' -exec sh -c 'tail -c 2M "$1" > "$1.t"; mv "$1.t" "$1"' _ {} \;
  find work-lifecycle -type f -size +4M -print -delete
  tar czf all.tar.gz work-lifecycle && rm -rf work-lifecycle
)
ls -la "$OUT"
exit $status
