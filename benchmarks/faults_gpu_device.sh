#!/usr/bin/env bash
# One device call (kind nvidia-h100-x2): benchmarks/faults_gpu.py, vLLM's API server
# SIGKILLed mid-run in the split NCCL layout (trainer GPU 0, vLLM GPU 1), then colocate and
# lora_only (one GPU each, at the same time); everything inside GPU_TOTAL (default 470 s:
# under 8 minutes; the call's limit is 600).
# Before: the vLLM parts in /root/vv/part-* (docs/gpu.md); .whl (tomli_w) carried.
# Call:   run(command="bash benchmarks/faults_gpu_device.sh", carry=[".whl"],
#             kind="nvidia-h100-x2", timeout_s=600)
# Out:    faults_gpu.md (the table, rewritten after every cell), faults_gpu.json,
#         faults_gpu.log (console), all.tar.gz (each cell's events, metrics and logs).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/faults_gpu.log") 2>&1
TOTAL=${GPU_TOTAL:-470}
source benchmarks/gpu_setup.sh
left=$((TOTAL - SECONDS - 40))
# Two phases (colocate + lora_only, then split), each cell within half of what is left.
# shellcheck disable=SC2086
timeout -k 10 "$left" python3 benchmarks/faults_gpu.py --out "$OUT" --work /tmp/faults_gpu \
  --budget $((left / 2 - 15)) ${FAULTS_ARGS:-}
status=$?
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
(
  cd /tmp/faults_gpu || exit
  find . \( -name '*.safetensors' -o -name 'rollouts.db*' -o -name 'checkpoints' -o -name model \) \
    -prune -exec rm -rf {} +
  find . -type f -size +4M -name '*.log' -exec sh -c 'tail -c 2M "$1" > "$1.t"; mv "$1.t" "$1"' _ {} \;
  tar czf "$OUT/all.tar.gz" .
)
ls -la "$OUT"
exit $status
