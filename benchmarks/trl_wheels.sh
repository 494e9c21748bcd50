#!/usr/bin/env bash
# Here (not on the device): the wheels TRL's GRPOTrainer needs that the GPU image lacks, for
# benchmarks/gpu_workload.py's TRL rows. TRL 1.16.0 supports vLLM 0.22-0.31 (its own check,
# trl/import_utils.py), so the carried vLLM 0.24.0; the image has accelerate, pyarrow,
# pandas, xxhash, fsspec, huggingface_hub and transformers 5.17, the vLLM bundle has dill.
# Result: .trl-wheels/*.whl (about 1.7 MiB, git-ignored), carried whole with the run call;
# gpu_workload_device.sh installs them with pip --no-index --no-deps. Run from the root.
set -euo pipefail
dest=.trl-wheels
exclude=$(git rev-parse --git-path info/exclude)
grep -qx "/$dest/" "$exclude" 2>/dev/null || echo "/$dest/" >> "$exclude"
rm -rf "$dest" && mkdir -p "$dest"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux2014_x86_64 -d "$dest" \
  trl==1.16.0 datasets==5.2.0 multiprocess==0.70.19
ls -la "$dest"; du -sh "$dest"
