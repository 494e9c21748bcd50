#!/usr/bin/env bash
# One H200 device call (kind nvidia-h200 or nvidia-h100-x1): benchmarks/colocate_gpu.py,
# colocate vs shared_vllm on one GPU (largest batch that trains, step time, sleep + wake +
# sync per step for the 0.5B / 1.5B / 3B shapes at random init). Cells are written to
# $OUT/colocate_gpu.json as they finish, so a cut-short call still brings back numbers.
#
# Before (here, once): vLLM 0.24.0's --enable-sleep-mode imports flashinfer (pinned at
# 0.6.12), which the vLLM bundle lacks; put it and its small dependencies in .whl/ (~26 MB):
#   plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
#         --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
#   python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp "${plat[@]}" -d .whl flashinfer-python==0.6.12 einops ninja \
#     tabulate nvidia-cudnn-frontend==1.32.0 cuda-tile==1.7.0
# (flashinfer-cubin==0.6.12, its precompiled kernels, is 447 MB: 11 more parts; carry it
# only if the log says flashinfer needs it.) Then the vLLM parts in /root/vv/part-* as for
# every device script (docs/gpu.md, one part per call while the machine stays warm).
# Call:   run(command="bash benchmarks/colocate_device.sh", carry=[".whl"], timeout_s=600)
# Extra arguments for colocate_gpu.py go in COLOCATE_ARGS (e.g. "--steps 2 --batches 8,32").
set -uo pipefail
OUT=${OUT:-/tmp/colocate_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/colocate_device.log") 2>&1
source benchmarks/gpu_setup.sh
if ! python3 -c "import flashinfer" 2>/dev/null; then   # a warm machine may predate .whl
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-fi .whl/*.whl
  export PYTHONPATH=$PYTHONPATH:/tmp/site-fi
fi
python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)" \
  || echo "colocate_device: flashinfer not importable: vLLM --enable-sleep-mode will not start"
# shellcheck disable=SC2086
timeout -k 10 "${COLOCATE_CAP:-$((560 - SECONDS))}" python3 benchmarks/colocate_gpu.py --out "$OUT" \
  --work /tmp/colocate_gpu ${COLOCATE_ARGS:-}
rc=$?
echo "colocate_device: exit $rc after ${SECONDS}s"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
# server logs (vLLM's own lines: sleep freed X GiB, wake-up times) come back in one archive
tar czf "$OUT/server_logs.tar.gz" -C /tmp/colocate_gpu --wildcards '*/server.log' 2>/dev/null
exit $rc
