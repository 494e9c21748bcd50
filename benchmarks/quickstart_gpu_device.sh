#!/usr/bin/env bash
# One device call (kind nvidia-h200-x2, or nvidia-h200 with QUICKSTART_GPUS="0"):
# benchmarks/quickstart_gpu.py, profiles/quickstart-gpu.toml in every mode at the same time,
# spread over the GPUs, everything inside GPU_TOTAL (default 560 s; the call's limit is 600).
# Before: the vLLM parts in /root/vv/part-* (docs/gpu.md); .whl (tomli_w) carried.
# Call:   run(command="bash benchmarks/quickstart_gpu_device.sh", carry=[".whl"],
#             kind="nvidia-h200-x2", timeout_s=600)
# Colocate on two GPUs alone (issue 13): QUICKSTART_GPUS="2 3"
#   QUICKSTART_ARGS="--modes colocate --colocate-ranks 2" (2 trainer ranks + vLLM DP 2).
# Out:    quickstart_gpu.md (the table), quickstart_gpu.log (console), all.tar.gz (JSON,
#         profiles, metrics, logs).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/quickstart_gpu.log") 2>&1
TOTAL=${GPU_TOTAL:-560}
source benchmarks/gpu_setup.sh
# shellcheck disable=SC2086
timeout -k 10 $((TOTAL - SECONDS - 30)) python3 benchmarks/quickstart_gpu.py --out "$OUT" \
  --gpus ${QUICKSTART_GPUS:-0 1} --budget $((TOTAL - SECONDS - 60)) ${QUICKSTART_ARGS:-}
status=$?
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
(
  cd "$OUT" || exit
  find . \( -name '*.safetensors' -o -name 'rollouts.db*' -o -name 'checkpoints' \) \
    -prune -exec rm -rf {} +
  find . -mindepth 2 -type f -size +4M -name '*.log' -exec sh -c 'tail -c 2M "$1" > "$1.t"; mv "$1.t" "$1"' _ {} \;
  find . -mindepth 2 -type f -size +4M -print -delete
  tar czf /tmp/quickstart_all.tar.gz --exclude=quickstart_gpu.log --exclude=quickstart_gpu.md .
  rm -rf -- work-quickstart/ ./*.json
  mv /tmp/quickstart_all.tar.gz all.tar.gz
)
ls -la "$OUT"
exit $status
