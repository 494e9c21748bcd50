#!/usr/bin/env bash
# One device call, one GPU only: COLOCATE_GPU (physical index, default 0), so other work can
# use the host's other GPUs in the same call (kind nvidia-h200, or -x2/-x4 beside other work):
# `colocate` on vLLM, in stages, each inside its own time cap (seconds, after the stage name),
# the whole script inside COLOCATE_TOTAL (default 545 s).
#   toy     benchmarks/gpu_modes.py --modes colocate: the toy task through `grpo-tui run`
#           (supervisor, API, vLLM with sleep mode, trainer, environment), 40 steps, the
#           reward first -> last, sync and phase times per step
#   memory  benchmarks/colocate_gpu.py: colocate vs shared_vllm (no sleep) at Qwen2.5-1.5B's
#           shape, the largest batch that trains and the step time (same
#           gpu_memory_utilization 0.5, so vLLM's KV cache is half the card), then the
#           per-step sleep + wake + load overhead at the 0.5B and 3B shapes while time is left
# Every process is pinned to that GPU (CUDA_VISIBLE_DEVICES, the profiles' gpus = [N]) and
# uses ports from 23100 (other benchmarks use 21000+), so work on other GPUs in the same
# call is not touched. Three files come back in $OUT: colocate_toy.md, colocate_gpu.md and
# colocate_all.tar.gz (raw JSON, diagnostics, run logs, vLLM's logs, this script's log).
# Before: the vLLM parts in /root/vv/part-* (carried one per call, see docs/gpu.md).
# Call:   run(command="bash benchmarks/colocate_device.sh toy:250 memory", carry=[".whl"],
#             kind="nvidia-h200", timeout_s=600)
# flashinfer: vLLM 0.24's sleep mode was not seen to need it in its sources; if vLLM's log
# says "No module named 'flashinfer'", the wheels in .whl/fi/ (not installed otherwise, so
# vLLM's choices elsewhere do not change) are installed and the toy stage runs again.
# COLOCATE_CPU=1: the same stages with the built-in server on CPU (tiny shapes): a check of
# this script's plumbing here, no GPU numbers.
set -uo pipefail
OUT=${OUT:-/tmp/colocate_out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/colocate_device.XXXXXX)   # what comes back (packed at the end)
TOY_WORK=$W-toy MEMORY_WORK=$W-memory          # run directories, models: not packed
exec > >(tee -a "$W/colocate_device.log") 2>&1
TOTAL=${COLOCATE_TOTAL:-545}
CPU=${COLOCATE_CPU:-0}
GPU=${COLOCATE_GPU:-0}
if [ "$CPU" = 1 ]; then
  export PYTHONPATH=$PWD
  TOY=(--backends builtin --device cpu --quick --dtype float32)
  MEMORY=(--backend builtin --device cpu --dtype float32 --search-shape small --shapes small
    --batches 1,2 --seq-len 64 --gen-n 2 --gen-tokens 8)
else
  # shellcheck source=benchmarks/gpu_setup.sh
  source benchmarks/gpu_setup.sh
  TOY=(--backends vllm --pin-gpu "$GPU" --steps "${TOY_STEPS:-40}")
  MEMORY=()  # in-process cuda:0 and its vLLM child: the GPU CUDA_VISIBLE_DEVICES names
fi
export CUDA_VISIBLE_DEVICES=$GPU PYTHONUNBUFFERED=1

flashinfer_missing() {
  grep -rqs "No module named 'flashinfer'" "$TOY_WORK"
}

use_flashinfer() {
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-fi .whl/fi/*.whl \
    || return 1
  export PYTHONPATH=$PYTHONPATH:/tmp/site-fi
  python3 -c "import flashinfer; print('colocate_device: flashinfer', flashinfer.__version__)"
}

toy() {
  rm -rf "$TOY_WORK" "$W/toy"
  timeout -k 10 "$1" python3 benchmarks/gpu_modes.py "${TOY[@]}" --modes colocate \
    --orphan-backend off --parallel 1 --port-base 23100 --budget $(($1 - 20)) \
    --stop-grace 15 --out "$W/toy" --work "$TOY_WORK"
}

status=0
for item in "$@"; do
  stage=${item%%:*}
  cap=${item#*:}
  left=$((TOTAL - SECONDS - 30))
  [ "$cap" = "$item" ] && cap=$left
  [ "$cap" -gt "$left" ] && cap=$left
  if [ "$cap" -lt 60 ]; then echo "colocate_device: no time left for $stage"; status=1; continue; fi
  echo "colocate_device: $stage with ${cap}s from $(date -u +%T)"
  case "$stage" in
    toy)
      started=$SECONDS
      toy "$cap"
      rc=$?
      left=$((cap - (SECONDS - started)))
      if flashinfer_missing && [ "$CPU" != 1 ] && use_flashinfer && [ "$left" -ge 150 ]; then
        echo "colocate_device: vLLM wanted flashinfer; toy again with ${left}s"
        toy "$left"
        rc=$?
      fi ;;
    memory)
      flashinfer_missing && [ "$CPU" != 1 ] && ! python3 -c "import flashinfer" 2>/dev/null \
        && use_flashinfer
      # SIGTERM at the cap: the script stops its vLLM server (8 s grace) before the SIGKILL
      timeout -k 25 "$cap" python3 benchmarks/colocate_gpu.py "${MEMORY[@]}" --out "$W" \
        --work "$MEMORY_WORK" --budget $((cap - 15))
      rc=$? ;;
    *) echo "colocate_device: unknown stage $stage"; rc=2 ;;
  esac
  echo "colocate_device: $stage exit $rc after ${SECONDS}s"
  [ "$rc" -ne 0 ] && status=$rc
done
[ "$CPU" = 1 ] || nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
# Three files back in $OUT (at most 8 come back from a call, shared with other work).
[ -f "$W/toy/gpu_modes.md" ] && cp "$W/toy/gpu_modes.md" "$OUT/colocate_toy.md"
[ -f "$W/colocate_gpu.md" ] && cp "$W/colocate_gpu.md" "$OUT/colocate_gpu.md"
mkdir -p "$W/server_logs"
for log in "$MEMORY_WORK"/*/server.log; do
  [ -f "$log" ] && tail -n 400 "$log" > "$W/server_logs/$(basename "$(dirname "$log")").log"
done
tar czf "$OUT/colocate_all.tar.gz" -C "$W" . && rm -rf "$W" "$TOY_WORK" "$MEMORY_WORK"
exit $status
