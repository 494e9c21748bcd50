#!/usr/bin/env bash
# Two-GPU device calls (kind nvidia-h200-x2): the stages named on the command line, in
# order, each inside its own time cap (seconds, after the stage name: sync:240), the whole
# call inside GPU_TOTAL (default 560 s; the call's limit is 600).
#   sync     benchmarks/nccl_sync.py: shared_vllm NCCL sync vs raw broadcast, 3 shapes
#   split    benchmarks/gpu_modes.py --layout split: every mode through `grpo-tui run`, the
#            trainer on GPU 0 and vLLM on GPU 1, plus the no-orphan check
#   fsdp2    benchmarks/gpu_modes.py --layout fsdp2: the same with a 2-rank FSDP2 trainer
#   resume   benchmarks/fsdp_runs.py: SIGKILL of a rank then resume; 2 ranks -> 1 rank
#   scaling  benchmarks/fsdp_scaling.py: trainer tokens/s and peak memory, 1 vs 2 GPUs, and
#            the 1-rank vs 2-rank equivalence of one optimizer step
# Before: the vLLM parts in /root/vv/part-* (carried one per call, see docs/gpu.md).
# Call:   run(command="bash benchmarks/gpu_split_device.sh sync:240 resume:300",
#             carry=[".whl"], timeout_s=600)
# Extra arguments for gpu_modes.py go in GPU_MODES_ARGS.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_split.log") 2>&1
TOTAL=${GPU_TOTAL:-560}
source benchmarks/gpu_setup.sh
status=0
for item in "$@"; do
  stage=${item%%:*}
  cap=${item#*:}
  [ "$cap" = "$item" ] && cap=$((TOTAL - SECONDS - 20))
  left=$((TOTAL - SECONDS - 20))
  [ "$cap" -gt "$left" ] && cap=$left
  if [ "$cap" -lt 60 ]; then echo "gpu_split_device: no time left for $stage"; status=1; continue; fi
  echo "gpu_split_device: $stage with ${cap}s from $(date -u +%T)"
  case "$stage" in
    sync) timeout -k 10 "$cap" python3 benchmarks/nccl_sync.py --out "$OUT" ;;
    split|fsdp2)
      rm -rf "/tmp/gpu_$stage"
      mkdir -p "$OUT/$stage"
      # shellcheck disable=SC2086
      timeout -k 10 "$cap" python3 benchmarks/gpu_modes.py --layout "$stage" \
        --out "$OUT/$stage" --work "/tmp/gpu_$stage" --budget $((cap - 30)) ${GPU_MODES_ARGS:-} ;;
    resume) timeout -k 10 "$cap" python3 benchmarks/fsdp_runs.py --out "$OUT" --budget $((cap - 20)) ;;
    scaling) timeout -k 10 "$cap" python3 benchmarks/fsdp_scaling.py --out "$OUT" ;;
    *) echo "gpu_split_device: unknown stage $stage"; status=2; continue ;;
  esac
  rc=$?
  echo "gpu_split_device: $stage exit $rc after ${SECONDS}s"
  [ "$rc" -ne 0 ] && status=$rc
done
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
# At most 8 files come back: the tables at the top, everything else in one archive.
(
  cd "$OUT" || exit
  for f in */*.md; do [ -f "$f" ] && cp "$f" "${f%%/*}_${f##*/}"; done
  tar czf /tmp/gpu_split_all.tar.gz --exclude=gpu_split.log . && rm -rf -- */ ./*.json
  mv /tmp/gpu_split_all.tar.gz all.tar.gz
)
exit $status
