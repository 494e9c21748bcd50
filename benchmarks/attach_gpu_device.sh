#!/usr/bin/env bash
# One device call (kind nvidia-h200, <= 300 s), issue 37's GPU numbers
# (benchmarks/attach_gpu.py): `grpo-tui serve` starts vLLM once; a run attached to it
# (first step, 5-step reward 0.8 from the command); a 4-cell sweep on it; attached-2,
# lora_only and none while room is kept for the next; serve stopped; the same 4 cells each
# with its own vLLM; a cold run if time is left. Everything inside GPU_TOTAL (default 285 s).
# Before: the vLLM parts in /root/vv/part-* (DEVICE_PLAN.md step 0); installed into
#         /tmp/site by an earlier call on the same warm machine (else the install here
#         takes 40-60 s of the budget and the last phases are cut, saying so).
# Call:   run(command="bash benchmarks/attach_gpu_device.sh", carry=[".whl"],
#             kind="nvidia-h200", timeout_s=300)
# Second call, if the first cut the own sweep short (its row says "est."):
#         command="ATTACH_ARGS=--own-only bash benchmarks/attach_gpu_device.sh" (the 4 cold
#         cells and a cold run only; the same carry and limit).
# Here:   GPU_CPU_CHECK=1 bash benchmarks/attach_gpu_device.sh (the CPU quickstart and the
#         built-in server: the plumbing and the time accounting, no GPU numbers).
# Out:    attach_gpu.md (the tables, rewritten after each phase), attach_gpu.json,
#         attach_gpu.log (this console), all.tar.gz (profiles, consoles, events, metrics,
#         logs; no weights): copy attach_gpu.md to benchmarks/results/attach_gpu.md.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/attach_gpu.log") 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
TOTAL=${GPU_TOTAL:-285}
echo "attach_gpu_device: $(date -u +%FT%TZ), budget ${TOTAL}s"
source benchmarks/gpu_setup.sh   # installs vLLM into /tmp/site unless there already
cpu=()
[ "${GPU_CPU_CHECK:-0}" = 1 ] && cpu=(--cpu)
# The rest: the benchmark's budget, its stops (<= 3 s each after a SIGTERM from timeout),
# then ~10 s here to pack $OUT.
budget=$((TOTAL - SECONDS - 30))
echo "attach_gpu_device: set up after ${SECONDS}s; the benchmark gets ${budget}s"
# shellcheck disable=SC2086
timeout -k 10 $((budget + 12)) python3 benchmarks/attach_gpu.py --out "$OUT" --budget "$budget" \
  "${cpu[@]}" ${ATTACH_ARGS:-}
status=$?
echo "attach_gpu_device: benchmark exit $status after ${SECONDS}s"
command -v nvidia-smi >/dev/null &&
  timeout 10 nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
(
  cd "$OUT" || exit
  find . \( -name '*.safetensors' -o -name 'rollouts.db*' -o -name 'checkpoints' \
    -o -name 'shared_weights' -o -name 'model' \) -prune -exec rm -rf {} +
  find . -mindepth 2 -type f -size +4M -print -delete
  timeout 20 tar czf /tmp/attach_all.tar.gz --exclude=attach_gpu.log --exclude=attach_gpu.md \
    --exclude=attach_gpu.json .
  rm -rf -- work-attach/
  mv /tmp/attach_all.tar.gz all.tar.gz
)
ls -la "$OUT"
echo "attach_gpu_device: done after ${SECONDS}s"
exit $status
