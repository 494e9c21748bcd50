#!/usr/bin/env bash
# ONE device call: benchmarks/gpu_workload.py in lanes that run side by side, one lane per
# GPU (or per pair of GPUs for the two-GPU parts). A lane is size:GPU[:part,part,...]; GPU
# is N or A+B. Each lane runs its parts one after the other, GPU_WORKLOAD_ARGS (e.g.
# "--repeats 2") times, alternating; everything ends inside GPU_TOTAL (default 575 s; the
# call's limit is 600). Each lane rewrites $OUT/lane-<GPU>.json after every run, so a lane
# or the call cut at its deadline still returns what it measured.
# Before: the vLLM parts in /root/vv/part-* (docs/gpu.md), and here: .whl (tomli_w) and
# .trl-wheels (benchmarks/trl_wheels.sh), carried with the call.
# Each call has its own id (GPU_CALL_ID, default the UTC time) and work folder: a warm
# machine's earlier runs are never read (issue 39); the models are kept across calls in
# $GPU_WORKLOAD_WORK/models (built once, seed 0) so vLLM's compile cache can hit. Before
# each run the lane's GPUs are checked empty (bounded wait, never a kill) and during it
# NVML samples the clocks and power (benchmarks/gpu_idle.py); GPU_WORKLOAD_ARGS="--repeats
# 2" runs A B then B A.
# The reduced plan of issue 31 (0.5B, CUDA graphs, ~9.5 min on nvidia-h100-x4):
#   GPU_WORKLOAD_LANES="0.5b:0:sync,trl-best 0.5b:1:trl-best,sync 0.5b:2+3:split,trl-async"
# Here: GPU_CPU_CHECK=1 runs the same lanes with --quick (built-in server, tiny shape, CPU):
# the script's plumbing, no GPU figures.
# Out (top of $OUT, 7 files at most): gpu_workload.md (every lane combined: the results
# file), <call>-lane-*.json (every number), gpu_workload.log (the console), all.tar.gz
# (per lane: consoles, profiles, metrics, logs; no weights).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
ROOT=${GPU_WORKLOAD_WORK:-/tmp/gpu_workload}
CALL_ID=${GPU_CALL_ID:-$(date -u +%Y%m%dT%H%M%SZ)}
WORK=$ROOT/$CALL_ID
if [ -e "$WORK" ]; then
  echo "gpu_workload_device: $WORK exists: another call's folder; give GPU_CALL_ID a new id"
  exit 2
fi
mkdir -p "$OUT" "$WORK" "$ROOT/models"
exec > >(tee -a "$OUT/gpu_workload.log") 2>&1
echo "gpu_workload_device: call $CALL_ID, work folder $WORK"
TOTAL=${GPU_TOTAL:-575}
source benchmarks/gpu_setup.sh
if ! python3 -c "import trl, datasets" 2>/dev/null; then  # a warm machine may have them
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    .trl-wheels/*.whl || echo "gpu_workload_device: TRL wheels not installed; its rows say why"
fi
python3 - <<'PY'
import importlib.metadata as m
import torch
names = ("trl", "datasets", "accelerate", "pyarrow", "multiprocess", "dill", "vllm", "aiohttp")
found = {}
for name in names:
    try:
        found[name] = m.version(name)
    except m.PackageNotFoundError:
        found[name] = "missing"
print("versions", found, "| cuda devices", torch.cuda.device_count())
PY
budget=$((TOTAL - SECONDS - 25))
quick=()
[ "${GPU_CPU_CHECK:-0}" = 1 ] && quick=(--quick)
LANES=${GPU_WORKLOAD_LANES:-0.5b:0:sync,trl-best 0.5b:1:trl-best,sync 0.5b:2+3:split,trl-async}
echo "gpu_workload_device: $LANES with ${budget}s each from $(date -u +%T)"
pids=()
for lane in $LANES; do
  IFS=: read -r size gpu parts <<<"$lane"
  name="lane-${gpu//+/-}"   # cuda:0+1, a two-GPU lane: lane-0-1
  mkdir -p "$WORK/$name"
  # shellcheck disable=SC2086
  timeout -k 10 $((budget + 10)) python3 benchmarks/gpu_workload.py --size "$size" \
    --device "cuda:$gpu" --out "$WORK/$name" --json "$OUT/$CALL_ID-$name.json" \
    --budget "$budget" --call-id "$CALL_ID" --models "$ROOT/models" "${quick[@]}" \
    --empty-mib "${GPU_EMPTY_MIB:-1024}" \
    ${parts:+--parts ${parts//,/ }} ${GPU_WORKLOAD_ARGS:-} > "$WORK/$name/console.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=$?
done
echo "gpu_workload_device: every lane done after ${SECONDS}s (status $status)"
tail -n 30 "$WORK"/lane-*/console.log
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
fi
python3 benchmarks/gpu_workload.py --combine "$OUT"/*-lane-*.json > "$OUT/gpu_workload.md"
cat "$OUT/gpu_workload.md"
# The logs back in one archive (no model weights, rollout databases, batch files, nor any
# file over 4 MiB).
(
  cd "$WORK" || exit
  find . \( -name '*.safetensors' -o -name 'floor-batches.jsonl' -o -name 'rollouts.db*' \
    -o -name 'checkpoints' -o -name '*-checkpoints' -o -name '*-run' -o -name model \) \
    -prune -exec rm -rf {} +
  find . -type f -size +4M -name '*.log' -exec sh -c 'tail -c 2M "$1" > "$1.t"; mv "$1.t" "$1"' _ {} \;
  find . -type f -size +4M -print -delete
  find . -type s -delete  # control sockets: tar cannot pack them
  tar czf "$OUT/all.tar.gz" lane-*
)
ls -la "$OUT"
exit $status
