#!/usr/bin/env bash
# ONE device call (kind nvidia-h200, ~9.5 min), issue 40: profiles/qwen2.5-7b-1gpu.toml
# (the Qwen2.5-7B shape, 6.53 B, bf16, trainer and vLLM on GPU 0) through `grpo-tui run`:
# the model built once into the tiny-model cache and timed apart, then shared_vllm (CUDA
# IPC) to a 5-step mean reward of 0.8, then colocate and lora_only while time is left,
# each on a GPU checked empty first (benchmarks/seven_b_1gpu.py). Everything inside
# GPU_TOTAL (default 570 s; the call's limit is 600).
# Before: the vLLM parts in /root/vv/part-* (docs/gpu.md), .whl (tomli_w) carried; the
# last part may come with this call (SEVEN_B_PART=.vllm-wheels/part-07, carried too).
# Call:   run(command="bash benchmarks/seven_b_1gpu_device.sh", carry=[".whl"],
#             kind="nvidia-h200", timeout_s=600)        (benchmarks/DEVICE_PLAN.md)
# Modes:  SEVEN_B_ARGS="--modes lora_only" (any of shared_vllm colocate lora_only).
# Here:   GPU_CPU_CHECK=1 bash benchmarks/seven_b_1gpu_device.sh (the built-in server on
#         CPU, the quickstart's tiny shape: the script's plumbing, no 7B figures).
# Out ($OUT, 4 files): seven_b_1gpu.md (the results, rewritten every 5 s), seven_b_1gpu.json
# (every number), seven_b.log (this console), seven_b_logs.tar.gz (profiles, events,
# metrics, timelines, logs; no weights).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/seven_b.log") 2>&1
TOTAL=${GPU_TOTAL:-570}
ROOT=${SEVEN_B_WORK:-/tmp/seven_b}
CALL_ID=${GPU_CALL_ID:-$(date -u +%Y%m%dT%H%M%SZ)}
if [ -n "${SEVEN_B_PART:-}" ]; then  # the last vLLM part, carried with this call
  mkdir -p /root/vv && cp "$SEVEN_B_PART" /root/vv/ || exit 3
fi
cpu=()
if [ "${GPU_CPU_CHECK:-0}" = 1 ]; then
  cpu=(--cpu)
fi
source benchmarks/gpu_setup.sh
echo "seven_b_1gpu_device: call $CALL_ID from $(date -u +%T), ${SECONDS}s in"
budget=$((TOTAL - SECONDS - 35))
# shellcheck disable=SC2086
timeout -k 15 $((budget + 20)) python3 benchmarks/seven_b_1gpu.py --out "$OUT" \
  --work "$ROOT" --call-id "$CALL_ID" --budget "$budget" --empty-mib "${GPU_EMPTY_MIB:-1024}" \
  "${cpu[@]}" ${SEVEN_B_ARGS:-}
status=$?
echo "seven_b_1gpu_device: exit $status after ${SECONDS}s"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
fi
(
  cd "$ROOT/$CALL_ID" 2>/dev/null || exit
  find . \( -name '*.safetensors' -o -name 'rollouts.db*' -o -name checkpoints -o -name model \
    -o -name rollouts \) -prune -exec rm -rf {} +
  find . -type f -size +4M -name '*.log' -exec sh -c 'tail -c 2M "$1" > "$1.t"; mv "$1.t" "$1"' _ {} \;
  find . -type f -size +4M -print -delete
  find . -type s -delete  # control sockets: tar cannot pack them
  tar czf "$OUT/seven_b_logs.tar.gz" .
)
ls -la "$OUT"
exit $status
