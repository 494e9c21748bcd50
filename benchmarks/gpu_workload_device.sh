#!/usr/bin/env bash
# ONE device call (kind nvidia-h200-x2): benchmarks/gpu_workload.py for the Qwen2.5-0.5B
# shape on GPU 0 and the 1.5B shape on GPU 1, at the same time, each size measured
# entirely on its own GPU (every process of a size gets CUDA_VISIBLE_DEVICES of its GPU;
# the profiles pin trainer and vLLM there with `gpus`). Everything ends inside GPU_TOTAL
# (default 570 s; the call's limit is 600). On one GPU (kind nvidia-h200), one size per
# call: GPU_WORKLOAD_LANES="1.5b:0" bash benchmarks/gpu_workload_device.sh.
# Before: the vLLM parts in /root/vv/part-* (docs/gpu.md), and here: .whl (tomli_w) and
# .trl-wheels (benchmarks/trl_wheels.sh), carried with the call.
# Call:   run(command="bash benchmarks/gpu_workload_device.sh", carry=[".whl", ".trl-wheels"],
#             kind="nvidia-h200-x2", timeout_s=600)
# Out:    gpu_workload.md (every size: the results file), gpu_workload.log (the console),
#         all.tar.gz (per lane: JSON, table, console, profiles, metrics, logs). Extra
#         gpu_workload.py flags: GPU_WORKLOAD_ARGS.
# Two GPUs in one lane (issue 13: colocate on both vs the split layout, same GPUs, one after
# the other): GPU_WORKLOAD_LANES="0.5b:0+1:split,colocate2".
# Four GPUs (kind nvidia-h200-x4), every part of both sizes in one call:
#   GPU_WORKLOAD_LANES="0.5b:0:floor,sync,overlap 0.5b:1:trl,trl-server,lora,colocate
#     1.5b:2:floor,sync,overlap 1.5b:3:trl,trl-server,lora,colocate"
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_workload.log") 2>&1
TOTAL=${GPU_TOTAL:-570}
source benchmarks/gpu_setup.sh
if ! python3 -c "import trl, datasets" 2>/dev/null; then  # a warm machine may have them
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    .trl-wheels/*.whl || echo "gpu_workload_device: TRL wheels not installed; its rows say why"
fi
python3 - <<'PY'
import importlib.metadata as m
import torch
names = ("trl", "datasets", "accelerate", "pyarrow", "multiprocess", "dill", "vllm")
found = {}
for name in names:
    try:
        found[name] = m.version(name)
    except m.PackageNotFoundError:
        found[name] = "missing"
print("versions", found, "| cuda devices", torch.cuda.device_count())
PY
budget=$((TOTAL - SECONDS - 40))
# Lanes run side by side, one per GPU: size:GPU, or size:GPU:part,part,... for some parts
# only (a size's parts spread over GPUs when one GPU's call time does not hold them all;
# --combine merges a size's lanes into one table, ratios against that call's floor).
LANES=${GPU_WORKLOAD_LANES:-0.5b:0 1.5b:1}
echo "gpu_workload_device: $LANES with ${budget}s each from $(date -u +%T)"
pids=()
for lane in $LANES; do
  IFS=: read -r size gpu parts <<<"$lane"
  dir="$OUT/lane-${gpu//+/-}"   # cuda:0+1, a two-GPU lane: lane-0-1
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  timeout -k 10 $((budget + 15)) python3 benchmarks/gpu_workload.py --size "$size" \
    --device "cuda:$gpu" --out "$dir" --budget "$budget" \
    ${parts:+--parts ${parts//,/ }} ${GPU_WORKLOAD_ARGS:-} > "$dir/console.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=$?
done
echo "gpu_workload_device: every lane done after ${SECONDS}s (status $status)"
tail -n 40 "$OUT"/lane-*/console.log
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
python3 benchmarks/gpu_workload.py --combine "$OUT"/lane-*/gpu_workload_*.json > "$OUT/gpu_workload.md"
cat "$OUT/gpu_workload.md"
# At most 8 files come back: the table and the console at the top, the rest in one archive
# (no model weights, rollout databases, batch files, nor any file over 4 MiB).
(
  cd "$OUT" || exit
  find . \( -name '*.safetensors' -o -name 'floor-batches.jsonl' -o -name 'rollouts.db*' \
    -o -name 'checkpoints' -o -name '*-checkpoints' -o -name '*-run' \) -prune -exec rm -rf {} +
  find . -mindepth 2 -type f -size +4M -name '*.log' -exec sh -c 'tail -c 2M "$1" > "$1.t"; mv "$1.t" "$1"' _ {} \;
  find . -mindepth 2 -type f -size +4M -print -delete  # weights, adapters, shared-weight files: named here
  tar czf /tmp/gpu_workload_all.tar.gz lane-*
  rm -rf -- lane-*/
  mv /tmp/gpu_workload_all.tar.gz all.tar.gz
)
ls -la "$OUT"
exit $status
