#!/usr/bin/env bash
# ONE device call (kind nvidia-h100-x4 or nvidia-h200-x4), issue 29: the Qwen2.5-7B shape on
# one node of four GPUs.
#   1. profiles/qwen2.5-7b-4gpu.toml through `grpo-tui run` (3 FSDP2 ranks on GPUs 0-2, vLLM
#      on GPU 3, shared_vllm over NCCL; the 6.5 B model built on the machine; vLLM eager to
#      save its compile) until the 5-step mean reward reaches 0.8 or SEVEN_B_RUN_S seconds
#      (default 330): benchmarks/quickstart_gpu.py --as-placed, its table rewritten every
#      5 s (curve, sync times, lag-0 logprob difference, peak memory per rank and vLLM).
#   2. benchmarks/nccl_sync.py at the 7B shape (152,064 vocabulary, 7.62 B, 15.2 GB in
#      bf16), trainer GPU 0 -> vLLM GPU 3: phases against a raw broadcast of the same
#      bytes, every --variants row (pause modes, the redundant prefix-cache reset, vLLM's
#      packed buffer, delta at lr 1e-6 and 1e-5 sparsity, delta with 64 MiB buckets), in
#      what is left of GPU_TOTAL (default 570 s).
# Before: the vLLM parts in /root/vv/part-* (docs/gpu.md) and .whl (tomli_w) carried.
# Call:   run(command="bash benchmarks/seven_b_device.sh", carry=[".whl"],
#             kind="nvidia-h100-x4", timeout_s=600)
# Out:    qwen2.5-7b-4gpu.md/.json (the run), nccl_sync.md/.json (the sync; a cut call leaves
#         nccl_sync_partial.json), seven_b.log (the console), seven_b_logs.tar.gz.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/seven_b.log") 2>&1
TOTAL=${GPU_TOTAL:-570}
RUN_S=${SEVEN_B_RUN_S:-330}
source benchmarks/gpu_setup.sh
echo "seven_b: the 7B run for at most ${RUN_S}s from $(date -u +%T) (${SECONDS}s in)"
timeout -k 15 $((RUN_S + 40)) python3 benchmarks/quickstart_gpu.py --out "$OUT" \
  --work /tmp/seven_b --profile profiles/qwen2.5-7b-4gpu.toml --as-placed \
  --modes shared_vllm --eager --budget "$RUN_S" --target 0.8
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
left=$((TOTAL - SECONDS - 20))
echo "seven_b: the sync benchmark with ${left}s left"
if [ "$left" -gt 90 ]; then
  timeout -k 10 "$left" python3 benchmarks/nccl_sync.py --out "$OUT" --work /tmp/nccl7b \
    --shapes qwen2.5-7b --variants all --syncs 3 --trainer-gpu 0 --vllm-gpu 3 \
    --gpu-memory-utilization 0.5 --start-timeout 180
else
  echo "seven_b: not run: the sync benchmark needs ~150 s, ${left}s left"
fi
(
  cd /tmp/seven_b 2>/dev/null || exit
  find . \( -name '*.safetensors' -o -name 'rollouts.db*' -o -name checkpoints -o -name model \) \
    -prune -exec rm -rf {} +
  find . -type f -size +4M -name '*.log' -exec sh -c 'tail -c 2M "$1" > "$1.t"; mv "$1.t" "$1"' _ {} \;
  tar czf "$OUT/seven_b_logs.tar.gz" .
)
ls -la "$OUT"
