#!/usr/bin/env bash
# Two-GPU device calls (kind nvidia-h200-x2), one stage per call, each inside 9.5 minutes:
#   sync:  benchmarks/nccl_sync.py (shared_vllm NCCL sync vs raw broadcast, 3 shapes)
#   modes: benchmarks/gpu_modes.py --layout split (every mode through `grpo-tui run`, the
#          trainer on cuda:0 and vLLM on GPU 1, plus the no-orphan check)
# Before: the vLLM parts in /root/vv/part-* (carried one per call, see docs/gpu.md).
# Call:   run(command="bash benchmarks/gpu_split_device.sh sync", carry=[".whl"], timeout_s=600)
set -uo pipefail
stage=${1:?stage: sync or modes}
shift
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_split_$stage.log") 2>&1
TOTAL=${GPU_TOTAL:-560}
source benchmarks/gpu_setup.sh
case "$stage" in
  sync)
    timeout -k 10 $((TOTAL - SECONDS - 20)) python3 benchmarks/nccl_sync.py --out "$OUT" "$@"
    ;;
  modes)
    WORK=/tmp/gpu_split_work
    rm -rf "$WORK"
    budget=$((TOTAL - SECONDS - 40))
    timeout -k 10 $((budget + 30)) python3 benchmarks/gpu_modes.py --layout split \
      --out "$OUT" --work "$WORK" --budget "$budget" "$@"
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
status=$?
echo "gpu_split_device: $stage exit $status after ${SECONDS}s"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
exit $status
