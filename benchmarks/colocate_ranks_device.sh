#!/usr/bin/env bash
# One two-GPU device call (kind nvidia-h200-x2): `colocate` on both GPUs (2 FSDP2 ranks + 2
# vLLM replicas, one of each per GPU) vs the split layout (trainer GPU 0, vLLM GPU 1,
# shared_vllm over NCCL), same model and global batch, in stages, each inside its own time
# cap (seconds, after the stage name), the whole script inside COLOCATE_RANKS_TOTAL (560 s).
#   colocate  benchmarks/gpu_modes.py --layout colocate --modes colocate: the toy task
#             through `grpo-tui run` (torchrun with 2 ranks, vLLM --data-parallel-size 2
#             --enable-sleep-mode), STEPS steps: reward first -> last, sync and per-GPU
#             phase seconds (phase/<name>_s/rank<r>)
#   split     benchmarks/gpu_modes.py --layout split --modes shared_vllm: the same run with
#             the trainer on GPU 0 and vLLM alone on GPU 1
# then benchmarks/colocate_ranks.py: wall seconds per step, the trainer's step time, tokens/s
# per GPU of both, and the ratio (issue 13's goal: colocate >= 1.3x).
# Four files come back in $OUT: colocate_ranks.md (the comparison), colocate_gpu_modes.md,
# split_gpu_modes.md and colocate_ranks_all.tar.gz (JSON, diagnostics, run logs with vLLM's
# and every rank's output, this script's log).
# Before: the vLLM parts in /root/vv/part-* (carried one per call, see docs/gpu.md).
# Call:   run(command="bash benchmarks/colocate_ranks_device.sh colocate:280 split:220",
#             carry=[".whl"], kind="nvidia-h200-x2", timeout_s=600)
# COLOCATE_RANKS_CPU=1: the same stages on CPU (2 gloo ranks and the built-in server's 2
# replicas; `split` is then the built-in shared_vllm on one process): a check of this
# script's plumbing here, no GPU numbers.
set -uo pipefail
OUT=${OUT:-/tmp/colocate_ranks_out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/colocate_ranks.XXXXXX)    # what comes back (packed at the end)
exec > >(tee -a "$W/colocate_ranks_device.log") 2>&1
TOTAL=${COLOCATE_RANKS_TOTAL:-560}
CPU=${COLOCATE_RANKS_CPU:-0}
STEPS=${STEPS:-40}
if [ "$CPU" = 1 ]; then
  export PYTHONPATH=$PWD
  COMMON=(--backends builtin --device cpu --quick --dtype float32 --steps "$STEPS")
  SPLIT=(--layout same)
else
  # shellcheck source=benchmarks/gpu_setup.sh
  source benchmarks/gpu_setup.sh
  COMMON=(--backends vllm --steps "$STEPS")
  SPLIT=(--layout split)
fi
export PYTHONUNBUFFERED=1

layout() {  # name cap mode gpu_modes-args...
  local name=$1 cap=$2 mode=$3
  shift 3
  timeout -k 10 "$cap" python3 benchmarks/gpu_modes.py "${COMMON[@]}" "$@" --modes "$mode" \
    --orphan-backend off --parallel 1 --port-base 23300 --budget $((cap - 20)) \
    --stop-grace 15 --out "$W/$name" --work "$W-$name"
}

status=0
for item in "$@"; do
  stage=${item%%:*}
  cap=${item#*:}
  left=$((TOTAL - SECONDS - 25))
  [ "$cap" = "$item" ] && cap=$left
  [ "$cap" -gt "$left" ] && cap=$left
  if [ "$cap" -lt 60 ]; then echo "colocate_ranks_device: no time left for $stage"; status=1; continue; fi
  echo "colocate_ranks_device: $stage with ${cap}s from $(date -u +%T)"
  case "$stage" in
    colocate) layout colocate "$cap" colocate --layout colocate ;;
    split) layout split "$cap" shared_vllm "${SPLIT[@]}" ;;
    *) echo "colocate_ranks_device: unknown stage $stage"; false ;;
  esac
  rc=$?
  echo "colocate_ranks_device: $stage exit $rc after ${SECONDS}s"
  [ "$rc" -ne 0 ] && status=$rc
done
if [ -f "$W/colocate/gpu_modes.json" ] && [ -f "$W/split/gpu_modes.json" ]; then
  python3 benchmarks/colocate_ranks.py --colocate "$W/colocate" --split "$W/split" \
    --out "$OUT/colocate_ranks.md" || status=1
fi
[ "$CPU" = 1 ] || nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
# Four files back in $OUT (at most 8 come back from a call).
for name in colocate split; do
  [ -f "$W/$name/gpu_modes.md" ] && cp "$W/$name/gpu_modes.md" "$OUT/${name}_gpu_modes.md"
done
tar czf "$OUT/colocate_ranks_all.tar.gz" -C "$W" . && rm -rf "$W" "$W-colocate" "$W-split"
exit $status
