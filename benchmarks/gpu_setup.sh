# Sourced by the device scripts: unpack the carried vLLM 0.24.0 bundle, install it and our
# extra wheels (.whl) into /tmp/site, and set the environment every process of ours needs
# there (offline hub, no usage stats, NVLink multicast off). Sets PYTHONPATH.
# GPU_CPU_CHECK=1 (here, no GPU): install nothing, the same environment, so a device
# script can be dry-run on CPU before it costs device time.
if [ "${GPU_CPU_CHECK:-0}" = 1 ]; then
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  echo "gpu_setup: CPU check (GPU_CPU_CHECK=1): nothing installed"
  return 0 2>/dev/null || exit 0
fi
if ! ls /root/vv/part-* >/dev/null 2>&1; then
  echo "gpu_setup: /root/vv/part-* missing: carry the vLLM parts first (docs/gpu.md); nothing run"
  exit 3
fi
# Two device scripts in one call (one per GPU) may source this at once: one installs, the
# other waits for it (the lock), then finds the install done.
exec {gpu_setup_lock}>/tmp/gpu_setup.lock
flock "$gpu_setup_lock"
if [ ! -d /tmp/site/vllm ]; then   # a warm machine keeps /tmp/site between calls
  echo "gpu_setup: $(date -u +%FT%TZ) unpacking $(ls /root/vv/part-* | wc -l) parts"
  cat /root/vv/part-* | tar xf - -C /root || exit 3
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    /root/bundle/*.whl .whl/*.whl || exit 3
fi
flock -u "$gpu_setup_lock"
export PYTHONPATH=$PWD:/tmp/site
echo "gpu_setup: installed in ${SECONDS}s"
# No network there: never let a library try to reach a hub or send usage stats.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export CUDA_DEVICE_ORDER=PCI_BUS_ID  # GPU indices as nvidia-smi and our profiles number them
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv
python3 -c "import importlib.metadata as m; print({d: m.version(d) for d in
  ('torch', 'transformers', 'vllm', 'fastapi', 'uvicorn', 'pydantic', 'tomli_w', 'peft')})"
