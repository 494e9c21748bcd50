#!/usr/bin/env bash
# One device call: install the carried SGLang 0.5.17 bundle, then run benchmarks/gpu_modes.py
# for the SGLang backend in the modes it supports (none: weights reloaded in place through
# /update_weights_from_disk; lora_only: adapter swapped between /pause_generation and
# /continue_generation; lora_restart: the supervisor restarts SGLang with --lora-paths), on
# the toy task through the real stack, and the no-orphan check with a real SGLang server.
# With SGLANG_WITH_VLLM=1 and the vLLM parts also carried (/root/vv), vLLM runs the same
# modes at the same settings beside it, for the side-by-side table.
#
# Before: `bash benchmarks/sglang_wheels.sh` here (1.3 GB: 30 parts), then carry each part,
# one call each, back to back (files outside the repo copy last while the machine is warm):
#   run(command="mkdir -p /root/sg && cp .sglang-wheels/part-00 /root/sg/",
#       carry=[".sglang-wheels/part-00"])      ... and so on to part-29
# Call:   run(command="bash benchmarks/sglang_device.sh", carry=[".whl"], timeout_s=600)
# Install: wheels of packages the image already has are skipped (its torch 2.11.0+cu130 keeps
# its own CUDA libraries); SGLang's transformers 5.12.1 and tokenizers go to /tmp/sgtf, on
# the SGLang server's PYTHONPATH only (SGLANG_PATH, read by gpu_modes.py): with the image's
# transformers 5.17, SGLang 0.5.17 fails at import (it registers `qwen3_asr` again).
# SGLANG_BENCH=quickstart runs benchmarks/quickstart_gpu.py --backend sglang instead (the
# quickstart-gpu recipe in none, lora_only and lora_restart at once on GPU SGLANG_GPU):
# quickstart_gpu.md, quickstart_gpu.json, quickstart_runs.tar.gz.
# Output ($OUT): gpu_modes.md (table: sync latency median/max, inference and trainer tok/s,
# reward first vs last steps, per mode), gpu_modes.json, gpu_diagnostics.md, gpu_runs.tar.gz,
# sglang_device.log. Copy gpu_modes.md to benchmarks/results/sglang_modes.md.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
exec > >(tee "$OUT/sglang_device.log") 2>&1
TOTAL=${GPU_MODES_TOTAL:-530}
WORK=/tmp/sglang_work
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_ORDER=PCI_BUS_ID  # GPU indices as nvidia-smi and our profiles number them
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1 SGLANG_DISABLE_REQUEST_LOGGING=1

if ! ls /root/sg/part-* >/dev/null 2>&1; then
  echo "sglang_device: /root/sg/part-* missing: carry the SGLang parts first; nothing run"
  exit 3
fi
if [ ! -d /tmp/sgsite/sglang ]; then   # a warm machine keeps /tmp/sgsite between calls
  echo "sglang_device: unpacking $(ls /root/sg/part-* | wc -l) parts (30 expected)"
  mkdir -p /root/sgb && cat /root/sg/part-* | tar xf - -C /root/sgb || exit 3
  mapfile -t missing < <(python3 - /root/sgb/bundle <<'PY'
import importlib.metadata as metadata
import pathlib
import sys

for wheel in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    name = wheel.name.split("-")[0]
    if name in ("transformers", "tokenizers"):
        continue  # SGLang's own pins: /tmp/sgtf
    try:
        metadata.version(name)  # the image has it: keep the image's build
    except metadata.PackageNotFoundError:
        print(wheel)
PY
  )
  echo "sglang_device: installing ${#missing[@]} wheels the image lacks"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sgsite \
    "${missing[@]}" .whl/*.whl || exit 3
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sgtf \
    /root/sgb/bundle/transformers-*.whl /root/sgb/bundle/tokenizers-*.whl || exit 3
fi
backends=(sglang)
export PYTHONPATH=$PWD:/tmp/sgsite SGLANG_PATH=/tmp/sgtf
if [ "${SGLANG_WITH_VLLM:-0}" = 1 ]; then
  source benchmarks/gpu_setup.sh      # unpacks vLLM into /tmp/site, sets PYTHONPATH
  export PYTHONPATH=$PYTHONPATH:/tmp/sgsite
  backends+=(vllm)
fi
echo "sglang_device: installed in ${SECONDS}s"
nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv
python3 - <<'PY'
import importlib.metadata as m
for dist in ("torch", "torchvision", "transformers", "sglang", "sglang-kernel",
             "flashinfer-python", "peft"):
    try:
        print(dist, m.version(dist))
    except m.PackageNotFoundError:
        print(dist, "not installed")
PY
PYTHONPATH=$SGLANG_PATH:$PYTHONPATH python3 -c "import sglang.launch_server, transformers; \
print('sglang server side: transformers', transformers.__version__)" \
  || { echo "sglang_device: sglang does not import"; exit 4; }

rm -rf "$WORK"
budget=$((TOTAL - SECONDS - 40))
if [ "${SGLANG_BENCH:-modes}" = quickstart ]; then
  # profiles/quickstart-gpu.toml's recipe on SGLang, every mode it runs at once on GPU
  # ${SGLANG_GPU:-0}: reward per step, seconds to 0.8, sync latency, server tokens/s.
  echo "sglang_device: quickstart_gpu.py --backend sglang budget ${budget}s"
  timeout -k 10 $((budget + 30)) python3 benchmarks/quickstart_gpu.py --out "$OUT" \
    --backend sglang --modes none lora_only lora_restart --gpus "${SGLANG_GPU:-0}" \
    --budget "$budget" "$@"
  status=$?
  rm -rf "$OUT/work-quickstart"/*/runs/*/checkpoints "$OUT/work-quickstart"/*/runs/*/model
  tar czf "$OUT/quickstart_runs.tar.gz" -C "$OUT" --exclude='*.safetensors' \
    --exclude='rollouts.db*' work-quickstart && rm -rf "$OUT/work-quickstart"
else
  echo "sglang_device: gpu_modes.py ${backends[*]} budget ${budget}s"
  timeout -k 10 $((budget + 30)) python3 benchmarks/gpu_modes.py --out "$OUT" --work "$WORK" \
    --budget "$budget" --backends "${backends[@]}" --modes none lora_only lora_restart \
    --orphan-backend sglang "$@"
  status=$?
fi
echo "sglang_device: benchmark exit $status after ${SECONDS}s"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
exit $status
